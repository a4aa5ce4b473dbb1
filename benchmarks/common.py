"""What several benchmarks share: where the repository is, its shipped CPU config, and how a
benchmark builds shards, launches a command and reads what a run wrote.

Every benchmark runs from the repository root as ``python -m benchmarks.<family>.<name>``, so the
project's packages import as they do in the tests, with no edit of the import path. Command lines
come from ``pretrain.config.command_line``, the sample corpus from ``data_prep.sample_corpus``.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertforge.files import write_json_atomic
from bertforge.pretrain.config import command_line
from bertforge.pretrain.config.ds_config import load_user_config
from bertforge.pretrain.config.precision import PRECISION_BLOCKS, enabled_precision_block

REPO = Path(__file__).resolve().parents[1]
CPU_DS_CONFIG = REPO / "ds_configs" / "cpu.json"  # the shipped ZeRO-2 CPU config
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # one thread per rank: the 2-core CPU measurements


def json_precision(ds_config: Path) -> str | None:
    """The precision a DeepSpeed JSON enables itself (fp16 / bf16), or None."""
    block = enabled_precision_block(load_user_config(ds_config))
    return PRECISION_BLOCKS[block] if block else None


def precision_flags(ds_config: Path, precision: str) -> dict[str, Any]:
    """The trainer's --ds_config, and --precision only where that JSON enables none: a setting is
    given in one place (pretrain.config.one_home). A JSON enabling another precision is an error
    (a benchmark's sides would differ)."""
    enabled = json_precision(ds_config)
    if enabled not in (None, precision):
        raise ValueError(
            f"{ds_config} enables {enabled}, the benchmark asks for {precision}: give a JSON "
            f"without a precision block, or --precision {enabled}"
        )
    return {"ds_config": ds_config, **({"precision": precision} if enabled is None else {})}


def build_shards(corpus: Path | list[Path], out: Path, *, quiet: bool = True, **options) -> Path:
    """``python -m data_prep build`` of `corpus` into `out` with `options` as its flags (two
    workers unless given); an `out` that already holds a finished build is kept as it is."""
    if (Path(out) / "manifest.json").is_file():
        return out
    options.setdefault("workers", 2)
    subprocess.run(
        command_line.data_prep_build(corpus, out, **options),
        cwd=REPO,
        check=True,
        capture_output=quiet,
    )
    return out


def shards_manifest(shards: Path) -> dict[str, Any]:
    """The manifest of a finished build, read and checked by ``data_prep``."""
    from bertforge.data_prep.reader import load_manifest

    return load_manifest(shards)


def vocab_size(shards: Path) -> int:
    """The vocabulary size of a build's tokenizer."""
    return shards_manifest(shards)["tokenizer"]["vocab_size"]


def one_thread_env(**extra: str) -> dict[str, str]:
    """This process's environment with one thread per rank (and `extra`)."""
    return {**os.environ, **ONE_THREAD, **extra}


def portable(obj: Any, run: str | os.PathLike | None = None) -> Any:
    """`obj` (JSON-like: dicts, lists, strings, numbers, Paths) with the paths of this machine
    written so that the result reads the same on any machine: inside the repository relative to
    it (``docs/bench/x.json``, the repository itself ``.``); else inside `run` (the benchmark's
    output folder) as ``$OUT/...`` (``$OUT/logs/train.log``, the folder itself ``$OUT``); this
    interpreter as ``python``. Paths inside longer strings (commands, error messages) are
    rewritten too. Other absolute paths are left as they are
    (``tests/benchmarks/test_bench_paths.py`` checks that the committed results hold none)."""
    roots = [(str(REPO), "", ".")]
    if run is not None:
        run_abs = Path(run).absolute()
        if not run_abs.is_relative_to(REPO):  # a run inside the repository: repository-relative
            roots.insert(0, (str(run_abs), "$OUT/", "$OUT"))
    subs = [(re.escape(sys.executable) + r"(?![\w./-])", "python")]
    for root, inside, itself in roots:
        # ROOT/rest -> INSIDE + rest; ROOT alone -> ITSELF; never a prefix of a longer name
        subs.append((re.escape(root) + r"/(?=[^\s/])", inside))
        subs.append((re.escape(root) + r"(?![\w.-])", itself))

    def fix(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [fix(v) for v in value]
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str):
            for pattern, repl in subs:
                value = re.sub(pattern, lambda _, r=repl: r, value)
        return value

    return fix(obj)


def write_results(path: str | os.PathLike, obj: Any, run: str | os.PathLike | None = None, **kw):
    """A benchmark's result JSON, written atomically with its paths made :func:`portable`
    (relative to the repository, or to `run`: the benchmark's output folder)."""
    write_json_atomic(path, portable(obj, run), **kw)


def random_bert_mlm(preset: str, vocab_size: int, seed: int = 0, **config: Any):
    """transformers' ``BertForMaskedLM`` of one of our presets' shapes, randomly initialised by
    transformers under ``torch.manual_seed(seed)`` (``config``: more ``BertConfig`` fields): the
    HF baselines' model and the benchmarks' random-weights arm."""
    import torch
    import transformers

    from bertforge.pretrain.model.registry import PRESETS

    shape = PRESETS[preset]
    conf = transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        **config,
    )
    torch.manual_seed(seed)
    return transformers.BertForMaskedLM(conf)


def _peak_rss_bytes(pid: int) -> int:
    """VmHWM (the kernel's high-water mark of the resident set) of `pid`, in bytes; 0 if gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def run_ranks_measured(
    cmd: list[str], log: Path, env: dict[str, str], poll_s: float = 0.25
) -> tuple[float, list[int]]:
    """Run a multi-rank launch (``deepspeed`` / ``torchrun``) with its output in `log`; returns
    (wall seconds, each rank's peak RSS in bytes). A rank is a descendant that has LOCAL_RANK in
    its environment while its parent has not (launchers set it for their children only; loader
    workers inherit it from their rank, so they are not counted: forked, they share its pages).
    The peak is the kernel's VmHWM, polled until the rank exits (the last poll bounds it)."""
    import threading
    import time

    import psutil

    from bertforge.pretrain.distributed.startup import LAUNCHER_VARS

    # A launch starts its own job: a rendezvous of the caller's (an in-process run sets
    # LOCAL_RANK in os.environ) would make every process look like a rank's loader worker.
    env = {k: v for k, v in env.items() if k not in LAUNCHER_VARS}
    peaks: dict[int, int] = {}
    ranks: set[int] = set()
    start = time.time()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        done = threading.Event()

        def has_local_rank(p: psutil.Process) -> bool:
            try:
                return "LOCAL_RANK" in p.environ()
            except (psutil.Error, OSError):
                return False

        def poll() -> None:
            root = psutil.Process(proc.pid)
            while not done.is_set():
                try:
                    children = root.children(recursive=True)
                except psutil.Error:
                    children = []
                for child in children:
                    # Only a positive answer is kept: a child seen between the launcher's fork
                    # and its exec still shows the launcher's environment (no LOCAL_RANK yet).
                    if child.pid not in ranks:
                        try:
                            parent = child.parent()
                        except psutil.Error:
                            continue
                        if has_local_rank(child) and not (
                            parent is not None and has_local_rank(parent)
                        ):
                            ranks.add(child.pid)
                    if child.pid in ranks:
                        peaks[child.pid] = max(peaks.get(child.pid, 0), _peak_rss_bytes(child.pid))
                done.wait(poll_s)

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        rc = proc.wait()
        done.set()
        watcher.join()
    if rc != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd[:4]))}... exited {rc}; see {log}")
    if not peaks:
        raise RuntimeError(
            f"{' '.join(map(str, cmd[:4]))}...: no rank process (LOCAL_RANK set by the launcher) "
            f"was seen while it ran; see {log}"
        )
    return time.time() - start, sorted(peaks.values(), reverse=True)


def each_corpus(args, prefix: str, measure_one: Callable[[Path, bool, Path], dict]) -> list[dict]:
    """The data benchmarks' corpora: ``measure_one(corpus, one_doc_per_line, scratch)`` for
    ``args.english`` (blank-line documents) and ``args.chinese`` (one a line), each given, in a
    scratch folder removed after; then the load average (the runs' noise)."""
    results = []
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for corpus, one_per_line in ((args.english, False), (args.chinese, True)):
            if corpus is not None:
                results.append(measure_one(corpus, one_per_line, Path(tmp) / corpus.stem))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return results


def write_corpus_results(path: Path | None, settings: dict, results: list[dict]) -> None:
    """A data benchmark's --json: its settings, this machine, its results (portable paths)."""
    if path:
        machine = {"machine": platform.machine(), "cpus": os.cpu_count()}
        write_json_atomic(path, portable({**settings, **machine, "results": results}))
