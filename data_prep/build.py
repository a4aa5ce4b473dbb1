"""`bertforge prep build`: inputs -> tokenizer -> work units in parallel -> manifest.

Resumable by construction: the input stream is cut deterministically into work units (a fixed
number of documents or bytes, in order); unit k writes `shard-k` of each split and then a done
record under OUT/.work/. A restart with the same arguments re-reads the inputs, skips units whose
record and files are present, and writes the manifest (the completion marker) last. Different
arguments or another tokenizer in an existing folder are refused.

Split across machines (data_prep.partition): `prepare` makes the tokenizer (and the
decontamination index) once; then part K of N builds the units u % N == K into the same folder
and records itself; `merge` (or the last part to finish) writes the manifest. With
`decontaminate`, training documents that near-duplicate a validation document are dropped
(data_prep.decontam), counted per unit and in the manifest.

Bad input records (data_prep.inputs decides what one is, per input class) never stop the build:
each is skipped, the first few of each reason are printed with file and line, and all are counted
in the manifest's `bad_records` (count, by reason, the first few with file and line). The build
fails with one `error:` line and no manifest when nothing usable is left, or on an argument
mistake the inputs reveal (a --text_field no record has).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bertforge.data_prep.build_config import (
    BuildConfig,
    BuildError,
    build_key,
    check_config,
    refuse_mismatch,
)
from bertforge.data_prep.cleanup import part_owns, staging_path, undo_on_user_error
from bertforge.data_prep.decontam import NearDuplicateIndex, Signer
from bertforge.data_prep.input_checks import InputError, no_validation_hint
from bertforge.data_prep.inputs import DropCounter, expand_inputs, iter_documents
from bertforge.data_prep.layout import (
    MANIFEST,
    SPLITS,
    TOKENIZER_DIR,
    WORK_DIR,
    remove_stale_temporaries,
    token_dtype_for,
)
from bertforge.data_prep.lock import FolderLock, LockError
from bertforge.data_prep.manifest import bad_records, build_manifest, no_usable_input
from bertforge.data_prep.partition import (
    MergeLock,
    PartitionError,
    complete_units,
    remove_own_temporaries,
    write_part_record,
)
from bertforge.data_prep.reader import load_manifest
from bertforge.data_prep.tokenizer import describe, import_tokenizer, train_wordpiece
from bertforge.data_prep.units import finished, run_units
from bertforge.data_prep.wordstart import read_protected_terms
from bertforge.data_prep.worker import (
    WorkerSpec,
    is_validation,
)
from bertforge.files import write_json_atomic
from bertforge.logs import get_logger

log = get_logger(__name__)

BUILD_STATE = "build.json"
_MERGE_TRIES = 30  # seconds a finishing part waits for another part's merge
DECONTAM_INDEX = "decontam-index.pkl"  # under OUT/.work: the validation documents' MinHash index


def _previous_build(out: Path) -> tuple[str, dict] | None:
    """("finished"|"unfinished", its build key) when OUT holds a data_prep build, else None."""
    for kind, path in (("finished", out / MANIFEST), ("unfinished", out / WORK_DIR / BUILD_STATE)):
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            key = data.get("build_key", data) if kind == "finished" else data
            if isinstance(key, dict) and "format_version" in key and "inputs" in key:
                return kind, key
    return None


def _prepare_output(cfg: BuildConfig, key: dict, staging: bool = False) -> bool:
    """Make OUT ready; returns True when an identical build is already complete there.
    ``staging``: OUT is our own staging folder, restarted unless it resumes this very build."""
    out = cfg.output
    if out.exists() and not out.is_dir():
        raise BuildError(f"--output {out} is a file; give a folder.")
    if out.is_dir() and any(out.iterdir()):
        previous = _previous_build(out)
        if previous is None:
            raise BuildError(
                f"--output {out} is not empty and holds no data_prep build (nothing "
                "was deleted, even with --overwrite); use a new or empty folder."
            )
        kind, old_key = previous
        nothing_done = kind == "unfinished" and not any((out / WORK_DIR).glob("unit-*.json"))
        if cfg.overwrite or (old_key != key and (nothing_done or staging)):
            # A failed start with other arguments left nothing to resume: start over.
            shutil.rmtree(out)
        else:
            refuse_mismatch(out, old_key, key, f"an {kind} build")
            if kind == "finished":
                return True
    (out / WORK_DIR).mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / WORK_DIR / BUILD_STATE, key)
    for folder in (out, *(out / s for s in SPLITS), out / WORK_DIR):
        remove_stale_temporaries(folder)
    return False


def _drops(cfg: BuildConfig, quiet: bool = False) -> DropCounter:
    """The counter of bad records of one pass over the input: a file with more lines that are
    not UTF-8 than --max_invalid_utf8_share fails the first pass that reads it to its end (the
    failed build then removes what it wrote: data_prep.cleanup)."""
    return DropCounter(quiet=quiet, max_invalid_utf8_share=cfg.max_invalid_utf8_share)


def _tokenizer(cfg: BuildConfig, files: list[Path]) -> None:
    """Put the tokenizer into OUT/tokenizer (train it, import it, or keep a resumed one)."""
    tok_dir = cfg.output / TOKENIZER_DIR
    if tok_dir.is_dir():
        return
    if cfg.tokenizer:
        # quiet: _source_fingerprint imported it first and said what it turned off
        import_tokenizer(
            Path(cfg.tokenizer),
            cfg.lowercase,
            tok_dir,
            quiet=True,
            max_length=cfg.sequences.max_seq_len,
        )
        return
    log.info(f"training a WordPiece vocabulary of {cfg.vocab_size} on the training documents")

    def train_docs() -> Iterator[str]:  # read twice (data_prep.tokenizer.continuation_pieces)
        return (
            d
            for d in iter_documents(files, cfg.input, _drops(cfg, quiet=True))
            if not is_validation(d, cfg.validation_fraction)
        )

    lowercase = cfg.lowercase is not False
    train_wordpiece(
        train_docs, cfg.vocab_size, lowercase, tok_dir, cfg.min_frequency, cfg.sequences.max_seq_len
    )


def _source_fingerprint(cfg: BuildConfig) -> str:
    """Fingerprint of --tokenizer as it will be saved (checks the casing flags against it)."""
    with tempfile.TemporaryDirectory() as tmp:
        import_tokenizer(Path(cfg.tokenizer), cfg.lowercase, Path(tmp) / "tok")
        info = describe(Path(tmp) / "tok")
    if cfg.lowercase is not None and cfg.lowercase != info.lowercase:
        raise BuildError(
            f"--{'' if cfg.lowercase else 'no_'}lowercase conflicts with --tokenizer "
            f"{cfg.tokenizer}, which {'does' if info.lowercase else 'does not'} "
            "lowercase; drop the flag (a loaded tokenizer keeps its own casing)."
        )
    return info.fingerprint


def _index_path(out: Path) -> Path:
    return out / WORK_DIR / DECONTAM_INDEX


def _decontam_index(cfg: BuildConfig, files: list[Path]) -> None:
    """Index the validation documents' MinHash signatures once (kept under OUT/.work)."""
    path = _index_path(cfg.output)
    if cfg.decontaminate is None or path.is_file():
        return
    log.info("indexing the validation documents for decontamination")
    val_docs = (
        d
        for d in iter_documents(files, cfg.input, _drops(cfg, quiet=True))
        if is_validation(d, cfg.validation_fraction)
    )
    NearDuplicateIndex.build(val_docs, cfg.decontaminate, Signer()).save(path)


def _setup(
    cfg: BuildConfig, staging: bool = False
) -> tuple[list[Path], list[str] | None, dict, bool]:
    """Check the arguments, compute the build key and make OUT ready (``staging``: see
    :func:`_prepare_output`); the bool says whether an identical build is complete there."""
    check_config(cfg)
    files = expand_inputs(list(cfg.inputs))
    terms = read_protected_terms(Path(cfg.protected_terms)) if cfg.protected_terms else None
    source_fp = _source_fingerprint(cfg) if cfg.tokenizer else None
    key = build_key(cfg, files, terms, source_fp)
    if cfg.num_partitions > 1:
        return files, terms, key, _require_prepared(cfg, key)
    if _prepare_output(cfg, key, staging):
        return files, terms, key, True
    _tokenizer(cfg, files)
    info = describe(cfg.output / TOKENIZER_DIR)
    if source_fp and info.fingerprint != source_fp:
        raise BuildError(
            f"{cfg.output} holds shards of another tokenizer (fingerprint "
            f"{info.fingerprint[:12]}, yours {source_fp[:12]}). Use a new --output "
            "folder or pass --overwrite."
        )
    _decontam_index(cfg, files)
    return files, terms, key, False


def _require_prepared(cfg: BuildConfig, key: dict) -> bool:
    """A part runs in a folder `prepare` made with the same arguments (True: already merged)."""
    out = cfg.output
    hint = (
        "run `bertforge prep prepare` with the same arguments (without --num_partitions "
        "and --partition) once before the parts"
    )
    previous = _previous_build(out) if out.is_dir() else None
    if previous is None:
        raise BuildError(f"{out} holds no prepared build: {hint}.")
    kind, old_key = previous
    refuse_mismatch(out, old_key, key, f"a build ({kind})")
    if kind == "finished":
        return True
    missing = [
        p
        for p in (
            out / TOKENIZER_DIR / "tokenizer.json",
            *([_index_path(out)] if cfg.decontaminate is not None else []),
        )
        if not p.is_file()
    ]
    if missing:
        raise BuildError(f"{out}: {', '.join(map(str, missing))} missing: {hint}.")
    remove_own_temporaries(
        [out / s for s in SPLITS] + [out / WORK_DIR], cfg.num_partitions, cfg.partition
    )
    return False


@contextmanager
def _output_lock(cfg: BuildConfig) -> Iterator[None]:
    """Hold the lock of this part of OUT (one job per part; parts run side by side by design).
    The lock sits next to OUT, since a fresh or --overwrite build may remove OUT itself."""
    out = cfg.output.resolve()
    n, k = cfg.num_partitions, cfg.partition
    lock = FolderLock(
        out.parent / f".{out.name}.part-{k}-of-{n}.lock",
        f"data_prep build of {out}" + (f" (part {k} of {n})" if n > 1 else ""),
    )
    try:
        lock.acquire()
    except LockError as e:
        raise BuildError(str(e)) from e
    try:
        yield
    finally:
        lock.release()


def prepare(cfg: BuildConfig) -> Path:
    """Step 1 of a partitioned build: OUT, its build state, the tokenizer (trained or loaded)
    and the decontamination index, made once before the parts start. Returns OUT."""
    cfg = replace(cfg, num_partitions=1, partition=0)
    with _output_lock(cfg), undo_on_user_error(cfg.output):
        _, _, _, done = _setup(cfg)
    if done:
        log.info(f"{cfg.output} already holds this build, nothing to do")
    return cfg.output


def merge(out: Path) -> dict[str, Any]:
    """Write the manifest of a build whose parts are all finished; refuses (PartitionError)
    while a part is missing or was built with other arguments."""
    out = Path(out)
    if (out / MANIFEST).is_file():
        return load_manifest(out)
    state = out / WORK_DIR / BUILD_STATE
    if not state.is_file():
        raise PartitionError(f"{state} not found: {out} is not a prepared data_prep build.")
    key = json.loads(state.read_text(encoding="utf-8"))
    _, parts = complete_units(out, key)
    total = parts[0]["total_units"]
    records = []
    for unit in range(total):
        record = finished(out, unit)
        if record is None:
            raise PartitionError(
                f"{out}: work unit {unit} has no complete shards although its "
                "part is recorded as finished; rerun that part."
            )
        records.append(record)
    if not any(r["splits"]["train"]["shard"] for r in records):
        dropped = Counter(parts[0]["input_dropped"])
        for r in records:
            dropped.update(r["dropped"])
        raise InputError(
            no_usable_input(
                dropped,
                bad_records(dropped, parts[0], records)["examples"],
                sum(r["splits"]["validation"]["documents"] for r in records),
            )
        )
    manifest = build_manifest(out, key, records, parts[0])
    write_json_atomic(out / MANIFEST, manifest)
    shutil.rmtree(out / WORK_DIR, ignore_errors=True)
    if (hint := no_validation_hint(manifest)) is not None:
        log.warning(hint)
    return manifest


def build(cfg: BuildConfig, argv: list[str] | None = None) -> dict[str, Any] | None:
    """Run (or resume) a build, or one part of it; returns the manifest, or None when this part
    is done but others are not (merge later). Raises BuildError/InputError on bad input (and
    removes what this command created: data_prep.cleanup), and BuildError at once when another
    job is building the same part of OUT."""
    with _output_lock(cfg):
        if cfg.num_partitions > 1:
            with undo_on_user_error(cfg.output, part_owns(cfg.num_partitions, cfg.partition)):
                return _build_locked(cfg, argv)
        if _replaces(cfg.output, cfg.overwrite):
            return _build_replacing(cfg, argv)
        with undo_on_user_error(cfg.output):
            return _build_locked(cfg, argv)


def _replaces(out: Path, overwrite: bool) -> bool:
    """Whether this --overwrite build replaces a build in OUT (one that stays until the new one
    is complete); a non-empty OUT that holds no build is refused, never deleted."""
    if not (overwrite and out.is_dir() and any(out.iterdir())):
        return False
    if _previous_build(out) is None:
        raise BuildError(
            f"--output {out} is not empty and holds no data_prep build (nothing "
            "was deleted, even with --overwrite); use a new or empty folder."
        )
    return True


def _build_replacing(cfg: BuildConfig, argv: list[str] | None) -> dict[str, Any] | None:
    """Build into a staging folder beside OUT (resumed when an interrupted --overwrite left one
    with the same arguments), then swap it in: a failure never costs the earlier build."""
    out, stage = cfg.output, staging_path(cfg.output)
    hint = f" (the earlier build in {out} stays until this one is complete)"
    with undo_on_user_error(stage, resume_hint=hint):
        manifest = _build_locked(replace(cfg, output=stage, overwrite=False), argv, cfg)
    old = out.parent / f".{out.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    out.rename(old)
    stage.rename(out)
    shutil.rmtree(old)
    log.info(f"replaced the earlier build in {out}")
    return manifest


def _build_locked(
    cfg: BuildConfig, argv: list[str] | None, user_cfg: BuildConfig | None = None
) -> dict[str, Any] | None:
    """:func:`build` while this part's lock is held (``user_cfg``: the arguments as given,
    recorded in the manifest, when ``cfg`` points at a staging folder)."""
    files, terms, key, done = _setup(cfg, staging=user_cfg is not None)
    if done:
        log.info(f"{cfg.output} already holds this build, nothing to do")
        return load_manifest(cfg.output)
    info = describe(cfg.output / TOKENIZER_DIR)
    spec = WorkerSpec(
        tokenizer_json=str(cfg.output / TOKENIZER_DIR / "tokenizer.json"),
        output=str(cfg.output),
        sequences=cfg.sequences,
        validation_fraction=cfg.validation_fraction,
        seed=cfg.seed,
        special_tokens=info.special_tokens,
        token_dtype=token_dtype_for(info.vocab_size).str,
        protected_terms=tuple(terms) if terms else None,
        lowercase=info.lowercase,
        decontam_index=(str(_index_path(cfg.output)) if cfg.decontaminate is not None else None),
        key_sentences=cfg.key_sentences,
    )
    drops = _drops(cfg)
    records, total = run_units(cfg, files, spec, drops)
    indexed = (
        len(NearDuplicateIndex.load(_index_path(cfg.output)))
        if cfg.decontaminate is not None
        else None
    )
    write_part_record(
        cfg.output,
        cfg.num_partitions,
        cfg.partition,
        {
            "build_key": key,
            "num_partitions": cfg.num_partitions,
            "partition": cfg.partition,
            "units": [r["unit"] for r in records],
            "total_units": total,
            "input_dropped": dict(drops.counts),
            "input_bad_examples": drops.examples,
            "split_documents": drops.split_documents,
            "protected_terms": len(terms or []),
            "decontam_indexed": indexed,
            "command": list(argv or sys.argv),
            "args": json.loads(json.dumps(asdict(user_cfg or cfg), default=str)),
        },
    )
    if cfg.num_partitions == 1:
        return merge(cfg.output)
    for _ in range(_MERGE_TRIES):  # a part may be merging right now (and find us missing)
        with MergeLock(cfg.output) as lock:
            if lock.held:
                try:
                    return merge(cfg.output)
                except PartitionError as e:
                    log.info(f"part {cfg.partition} of {cfg.num_partitions} done; {e}")
                    return None
        if (cfg.output / MANIFEST).is_file():
            return load_manifest(cfg.output)
        time.sleep(1.0)
    log.info(
        f"part {cfg.partition} of {cfg.num_partitions} done; another part holds "
        f"{cfg.output / WORK_DIR / 'merge.lock'}: run `bertforge prep merge "
        f"{cfg.output}` once every part has finished."
    )
    return None
