"""Command line: `bertforge prep build|prepare|merge|inspect|verify|check-overlap`
(docs/design.md section 4)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bertforge.cli import ArgumentParser, add_fields, from_args
from bertforge.data_prep import extend_tokenizer, remote_build
from bertforge.data_prep.build import build, merge, prepare
from bertforge.data_prep.build_config import BuildConfig
from bertforge.data_prep.object_store import Store, is_url
from bertforge.data_prep.overlap import overlap_lines, overlap_report
from bertforge.data_prep.report import bad_records, bad_records_line, summary, summary_lines, verify
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger, report

log = get_logger(__name__)

INTERRUPTED_EXIT = 130  # the shell's status for a command ended by Ctrl-C


# Fields that are no flag of `build` (InputConfig's is a safety limit); `prepare` makes the
# tokenizer and index once for every part, so it has no partition flags either.
_NOT_FLAGS = ("max_doc_bytes",)
_BUILD_ONLY = ("num_partitions", "partition")


def _folder(text: str) -> Path | str:
    """A folder argument: a Path, or a URL as it is (a Path would fold its ``//``)."""
    return text if is_url(text) else Path(text)


def _parser(prog: str = "bertforge prep") -> argparse.ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    extend_tokenizer.add_parser(sub)

    b = sub.add_parser("build", help="raw text -> tokenizer + packed binary shards + manifest")
    add_fields(b, BuildConfig, exclude=_NOT_FLAGS)
    pr = sub.add_parser(
        "prepare",
        help="step 1 of a partitioned build: the tokenizer (trained or "
        "loaded) and the decontamination index, made once",
    )
    add_fields(pr, BuildConfig, exclude=_NOT_FLAGS + _BUILD_ONLY)

    mg = sub.add_parser("merge", help="write the manifest once every part is finished")
    mg.add_argument("root", type=Path)

    co = sub.add_parser(
        "check-overlap",
        help="near-duplicates between two finished builds (A: the smaller one, e.g. an eval set)",
    )
    co.add_argument("a", type=Path)
    co.add_argument("b", type=Path)
    co.add_argument("--threshold", type=float, default=0.8, help="estimated Jaccard similarity")
    co.add_argument("--splits_a", nargs="+", default=["train", "validation"])
    co.add_argument("--splits_b", nargs="+", default=["train", "validation"])
    co.add_argument("--json", action="store_true", help="machine-readable output")

    i = sub.add_parser("inspect", help="counts, length histogram and decoded sample sequences")
    i.add_argument("root", type=Path)
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--samples", type=int, default=3)
    i.add_argument(
        "--protected_terms",
        type=Path,
        default=None,
        help="terms file to count and mark (default: the one the build used)",
    )
    i.add_argument(
        "--term_scan",
        type=int,
        default=10000,
        help="count term occurrences in this many sequences per split",
    )

    v = sub.add_parser("verify", help="recheck every checksum; non-zero exit on the first bad file")
    v.add_argument("root", type=_folder, help="the build's folder, or its URL (s3://...)")
    return p


def _report_built(m: dict, out: Path) -> None:
    lines = [
        f"{split}: {s['documents']:,} documents, {s['sequences']:,} sequences, "
        f"{s['tokens']:,} tokens in {len(s['shards'])} shards"
        for split, s in m["splits"].items()
    ]
    if m["dropped"]:
        lines.append(bad_records_line(bad_records(m)) + " (manifest.json: bad_records)")
    if "decontamination" in m:
        d = m["decontamination"]
        lines.append(
            f"decontamination: {d['train_documents_dropped']:,} of "
            f"{d['train_documents_checked']:,} training documents dropped as near-duplicates "
            f"of {d['validation_documents_indexed']:,} validation documents"
        )
    report([*lines, f"wrote {out}/manifest.json"])


def _build_or_prepare(args: argparse.Namespace, argv: list[str], url: str | None) -> None:
    cfg = from_args(BuildConfig, args)
    store = None
    if url:  # object storage: built in a staging folder, then uploaded (data_prep.remote_build)
        partitioned = cfg.num_partitions > 1
        store = remote_build.before(args.command, url, cfg.output, cfg.overwrite, partitioned)
    if args.command == "prepare":
        out = prepare(cfg)
        if store is not None:
            remote_build.after("prepare", store, cfg.output, None)
            out = url
        log.info(
            f"prepared {out} (tokenizer{' and decontamination index' * bool(cfg.decontaminate)})"
            f"; now run each part: bertforge prep build <the same arguments> "
            "--num_partitions N --partition K"
        )
        return
    m = build(cfg, argv=["bertforge", "prep", *argv])
    if store is not None:
        remote_build.after("build", store, cfg.output, m)
        if m is None:
            return
    if m is None:
        log.info(
            f"part {cfg.partition} of {cfg.num_partitions} done; the manifest is written when "
            f"the last part finishes (or: bertforge prep merge {cfg.output})"
        )
    else:
        _report_built(m, url or cfg.output)


def _run(args: argparse.Namespace, argv: list[str], url: str | None) -> None:
    """Run one parsed command other than extend-tokenizer (a UserError is the user's to fix)."""
    if args.command in ("build", "prepare"):
        _build_or_prepare(args, argv, url)
    elif args.command == "merge" and url:
        _report_built(remote_build.merge_remote(Store(url, flag="merge"), args.root), url)
    elif args.command == "merge":
        _report_built(merge(args.root), args.root)
    elif args.command == "check-overlap":
        r = overlap_report(
            args.a, args.b, args.threshold, tuple(args.splits_a), tuple(args.splits_b)
        )
        report(json.dumps(r, indent=1, ensure_ascii=False) if args.json else overlap_lines(r))
    elif args.command == "inspect":
        s = summary(
            args.root,
            samples=args.samples,
            terms_file=args.protected_terms,
            term_scan=args.term_scan,
        )
        report(json.dumps(s, indent=1, ensure_ascii=False) if args.json else summary_lines(s))
    else:
        check = remote_build.verify_remote if is_url(args.root) else verify
        files = check(args.root)
        report(f"ok: {len(files)} shard files and the tokenizer match {args.root}/manifest.json")


def main(argv: list[str] | None = None, prog: str = "bertforge prep") -> int:
    """Entry point; returns the exit status (2 for bad input or a bad shard folder, 130 for an
    interrupted build). ``prog``: the command's name in usage lines and errors."""
    given = list(sys.argv[1:] if argv is None else argv)
    local, url = remote_build.output_url(given)  # --output s3://...: a staging folder here
    args = _parser(prog).parse_args(local)
    try:
        if args.command == "extend-tokenizer":
            return extend_tokenizer.run_command(args)
        _run(args, given, url)
    except UserError as e:  # bad input, bad folder, bad terms file: the message says what to do
        log.error(str(e))
        return USER_ERROR_EXIT
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the build said what it kept and how to resume
        return INTERRUPTED_EXIT
    except BrokenPipeError:  # `inspect ... | head`: the reader went away, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
