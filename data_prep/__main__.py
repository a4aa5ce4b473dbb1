"""Command line: `python -m data_prep build|prepare|merge|inspect|verify|check-overlap`
(docs/design.md section 4)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from data_prep import extend_tokenizer
from data_prep.inputs import InputConfig
from data_prep.sequences import SequenceConfig


def _progress_mode(value: str) -> str:
    from data_prep.progress import normalize_mode

    try:
        return normalize_mode(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _add_build_args(b: argparse.ArgumentParser) -> None:
    """The arguments that define a build (shared by `build` and `prepare`)."""
    b.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help="text/.jsonl/.parquet files (optionally .gz/.zst), folders, globs, or a "
        "dataset saved with datasets' save_to_disk",
    )
    b.add_argument("--output", required=True, type=Path, help="output folder")
    tok = b.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", help="existing HF tokenizer folder or BERT vocab.txt")
    tok.add_argument(
        "--vocab_size",
        type=int,
        default=30522,
        help="train a WordPiece vocabulary of this size (default 30522)",
    )
    b.add_argument("--format", choices=("packed", "nsp"), default="packed")
    b.add_argument(
        "--max_seq_len", type=int, default=128, help="tokens per sequence including [CLS]/[SEP]"
    )
    b.add_argument(
        "--stride",
        type=int,
        default=None,
        help="packed: sliding windows of max_seq_len-2 tokens over each document "
        "with this stride (documents are then not concatenated)",
    )
    b.add_argument("--validation_fraction", type=float, default=0.01)
    b.add_argument("--text_field", default="text", help="jsonl key / parquet column")
    b.add_argument(
        "--one_doc_per_line",
        action="store_true",
        help="text files: one document per line (default: blank-line-separated blocks)",
    )
    b.add_argument("--protected_terms", help="file of terms kept whole for masking, one per line")
    b.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    low = b.add_mutually_exclusive_group()
    low.add_argument(
        "--lowercase",
        dest="lowercase",
        action="store_true",
        default=None,
        help="lowercase (default when training a vocabulary)",
    )
    low.add_argument("--no_lowercase", dest="lowercase", action="store_false")
    b.add_argument("--min_frequency", type=int, default=2, help="WordPiece trainer min frequency")
    b.add_argument("--short_seq_prob", type=float, default=0.1, help="nsp: as BERT")
    b.add_argument(
        "--shard_docs",
        type=int,
        default=10000,
        help="documents per work unit / shard (resume granularity)",
    )
    b.add_argument(
        "--shard_bytes", type=int, default=32 << 20, help="characters of text per work unit / shard"
    )
    b.add_argument(
        "--max_line_bytes",
        type=int,
        default=8 << 20,
        help="longer input lines are skipped and counted",
    )
    b.add_argument("--seed", type=int, default=12345)
    b.add_argument(
        "--overwrite", action="store_true", help="delete an existing build in --output first"
    )
    b.add_argument(
        "--decontaminate",
        type=float,
        nargs="?",
        const=0.8,
        default=None,
        metavar="JACCARD",
        help="drop training documents whose estimated Jaccard similarity (MinHash "
        "over 5-word / 5-CJK-character shingles) to a validation document is at "
        "least JACCARD (default 0.8 when the flag is given without a value)",
    )
    b.add_argument(
        "--progress",
        type=_progress_mode,
        default="auto",
        help="auto (a bar when stderr is a terminal, plain lines in a log), bar, lines or off",
    )
    b.add_argument(
        "--progress_interval_s",
        type=float,
        default=30.0,
        help="lines: at most one line per this many seconds (0: one per shard)",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    extend_tokenizer.add_parser(sub)

    b = sub.add_parser("build", help="raw text -> tokenizer + packed binary shards + manifest")
    _add_build_args(b)
    b.add_argument(
        "--num_partitions",
        type=int,
        default=1,
        help="split the build into N parts (one per machine, same --output on a "
        "shared file system); run `prepare` with the same arguments first",
    )
    b.add_argument(
        "--partition",
        type=int,
        default=0,
        help="the part this process builds, 0..N-1 (e.g. $SLURM_ARRAY_TASK_ID)",
    )

    pr = sub.add_parser(
        "prepare",
        help="step 1 of a partitioned build: the tokenizer (trained or "
        "loaded) and the decontamination index, made once",
    )
    _add_build_args(pr)

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
    v.add_argument("root", type=Path)
    return p


def _build_config(args: argparse.Namespace):
    from data_prep.build import BuildConfig

    return BuildConfig(
        inputs=tuple(args.input),
        output=args.output,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        lowercase=args.lowercase,
        min_frequency=args.min_frequency,
        sequences=SequenceConfig(
            format=args.format,
            max_seq_len=args.max_seq_len,
            stride=args.stride,
            short_seq_prob=args.short_seq_prob,
        ),
        input=InputConfig(
            text_field=args.text_field,
            one_doc_per_line=args.one_doc_per_line,
            max_line_bytes=args.max_line_bytes,
        ),
        validation_fraction=args.validation_fraction,
        protected_terms=args.protected_terms,
        workers=args.workers,
        shard_docs=args.shard_docs,
        shard_bytes=args.shard_bytes,
        seed=args.seed,
        overwrite=args.overwrite,
        decontaminate=args.decontaminate,
        num_partitions=getattr(args, "num_partitions", 1),
        partition=getattr(args, "partition", 0),
        progress=args.progress,
        progress_interval_s=args.progress_interval_s,
    )


def _print_built(m: dict, out: Path) -> None:
    for split, s in m["splits"].items():
        print(
            f"{split}: {s['documents']:,} documents, {s['sequences']:,} sequences, "
            f"{s['tokens']:,} tokens in {len(s['shards'])} shards"
        )
    if m["dropped"]:
        from data_prep.report import bad_records, bad_records_line

        print(bad_records_line(bad_records(m)) + " (manifest.json: bad_records)")
    if "decontamination" in m:
        d = m["decontamination"]
        print(
            f"decontamination: {d['train_documents_dropped']:,} of "
            f"{d['train_documents_checked']:,} training documents dropped as near-duplicates "
            f"of {d['validation_documents_indexed']:,} validation documents"
        )
    print(f"wrote {out / 'manifest.json'}")


def _build_or_prepare(args: argparse.Namespace, argv: list[str] | None) -> None:
    from data_prep.build import build, prepare

    cfg = _build_config(args)
    if args.command == "prepare":
        out = prepare(cfg)
        print(
            f"prepared {out} (tokenizer{' and decontamination index' * bool(cfg.decontaminate)})"
            f"; now run each part: python -m data_prep build <the same arguments> "
            "--num_partitions N --partition K"
        )
        return
    m = build(cfg, argv=["python", "-m", "data_prep", *(argv or sys.argv[1:])])
    if m is None:
        print(
            f"part {cfg.partition} of {cfg.num_partitions} done; the manifest is written when "
            f"the last part finishes (or: python -m data_prep merge {cfg.output})"
        )
    else:
        _print_built(m, cfg.output)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad input or a bad shard folder)."""
    args = _parser().parse_args(argv)
    if args.command == "extend-tokenizer":
        return extend_tokenizer.run_command(args)
    from data_prep.build import BuildError
    from data_prep.inputs import InputError
    from data_prep.partition import PartitionError
    from data_prep.reader import ShardError
    from data_prep.report import print_summary, summary, verify
    from data_prep.tokenizer import TokenizerError
    from data_prep.wordstart import ProtectedTermsError

    try:
        if args.command in ("build", "prepare"):
            _build_or_prepare(args, argv)
        elif args.command == "merge":
            from data_prep.build import merge

            _print_built(merge(args.root), args.root)
        elif args.command == "check-overlap":
            from data_prep.overlap import overlap_report, print_report

            r = overlap_report(
                args.a, args.b, args.threshold, tuple(args.splits_a), tuple(args.splits_b)
            )
            print(json.dumps(r, indent=1, ensure_ascii=False)) if args.json else print_report(r)
        elif args.command == "inspect":
            s = summary(
                args.root,
                samples=args.samples,
                terms_file=args.protected_terms,
                term_scan=args.term_scan,
            )
            if args.json:
                print(json.dumps(s, indent=1, ensure_ascii=False))
            else:
                print_summary(s)
        else:
            files = verify(args.root)
            print(f"ok: {len(files)} shard files and the tokenizer match {args.root}/manifest.json")
    except (
        BuildError,
        InputError,
        ShardError,
        TokenizerError,
        ProtectedTermsError,
        PartitionError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `inspect ... | head`: the reader went away, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
