"""Decontamination: speed (MB/s) and what it finds on a corpus with planted near-duplicates.

    python -m benchmarks.data.decontam --english tiny-shakespeare.txt --chinese hongloumeng.txt

One document a line: the English file's blank-line-separated blocks joined into lines, and the
Chinese file's non-empty lines. Every validation document (by data_prep's hash split,
--validation_fraction) with at least 20 shingles gets one edited copy planted in the training
input: a header word added and a share of its words (English) or characters (Chinese) replaced,
cycling through EDIT_RATES, so that the copies span true Jaccard similarities from ~1 down to
~0.3. Then two builds with the same tokenizer, without and with --decontaminate: the extra time
over the training text gives the MB/s, the manifest gives the counts, and each planted copy's
exact Jaccard similarity (over the shingle sets) is set against whether it was dropped (recall at
and above the threshold, drops below it). Documents dropped that are not planted copies are
listed: they are near-duplicates the corpus itself holds across the split.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bertforge.files import write_json_atomic
from bertforge.pretrain.config import command_line

os.environ.setdefault("OMP_NUM_THREADS", "1")

EDIT_RATES = (0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16)
HEADERS = ("Mirror:", "Copy:", "Reposted:", "Archived:")


def read_documents(english: Path, chinese: Path) -> list[str]:
    blocks = english.read_text(encoding="utf-8").split("\n\n")
    docs = [" ".join(b.split()) for b in blocks if b.strip()]
    docs += [ln.strip() for ln in chinese.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return docs


def edited_copy(doc: str, rate: float, rng: random.Random, fraction: float) -> str | None:
    """A copy with a header and `rate` of its words/characters replaced, landing in training."""
    from bertforge.data_prep.worker import is_validation

    english = " " in doc
    parts = doc.split(" ") if english else list(doc)
    for attempt in range(50):
        edited = list(parts)
        for i in rng.sample(range(len(parts)), round(rate * len(parts))):
            edited[i] = rng.choice(["alpha", "beta", "gamma"] if english else list("甲乙丙丁"))
        head = HEADERS[attempt % len(HEADERS)]
        copy = f"{head} " + " ".join(edited) if english else f"{head}" + "".join(edited)
        if not is_validation(copy, fraction):
            return copy
    return None


def exact_jaccard(a: str, b: str) -> float:
    from bertforge.data_prep.decontam import shingle_hashes

    sa, sb = set(shingle_hashes(a).tolist()), set(shingle_hashes(b).tolist())
    return len(sa & sb) / max(len(sa | sb), 1)


def timed_build(corpus: Path, out: Path, fraction: float, **options) -> tuple[float, dict]:
    """`data_prep build` in this process (one document a line, `options` as its flags): its
    seconds and its manifest."""
    from bertforge.data_prep.__main__ import main
    from bertforge.data_prep.reader import load_manifest

    argv = command_line.data_prep_build(
        corpus,
        out,
        one_doc_per_line=True,
        validation_fraction=fraction,
        workers=2,
        **options,
    )
    t0 = time.perf_counter()
    rc = main(argv[argv.index("build") :])  # data_prep's own argv: "build", "--input", ...
    if rc:
        raise SystemExit(f"build failed ({rc})")
    return time.perf_counter() - t0, load_manifest(out)


def plant(docs: list[str], fraction: float) -> tuple[list[str], list[dict]]:
    """The validation documents, and one edited copy of each with >= 20 shingles."""
    from bertforge.data_prep.decontam import shingle_hashes
    from bertforge.data_prep.worker import is_validation

    rng = random.Random(0)
    val = [d for d in docs if is_validation(d, fraction)]
    pairs = []
    for k, d in enumerate(d for d in val if len(shingle_hashes(d)) >= 20):
        rate = EDIT_RATES[k % len(EDIT_RATES)]
        copy = edited_copy(d, rate, rng, fraction)
        if copy is not None:
            pairs.append({"rate": rate, "jaccard": exact_jaccard(d, copy), "copy": copy})
    return val, pairs


def check_in_process(val: list[str], train_docs: list[str], threshold: float, tmp: Path) -> dict:
    """The build's own check (index the validation documents, filter the training ones), timed
    in this process: which documents it drops, and how fast."""
    from bertforge.data_prep.decontam import Decontaminator, NearDuplicateIndex, Signer

    t0 = time.perf_counter()
    NearDuplicateIndex.build(val, threshold, Signer()).save(tmp / "index.pkl")
    index_s = time.perf_counter() - t0
    checker = Decontaminator(tmp / "index.pkl")
    t0, c0 = time.perf_counter(), time.process_time()
    kept, stats = checker.filter(train_docs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    mb = sum(len(d.encode()) for d in train_docs) / 1e6
    return {
        "kept": set(kept),
        "dropped": stats["dropped"],
        "index_seconds": index_s,
        "mb_per_s": mb / wall,
        "mb_per_cpu_s": mb / cpu,
    }


def summarise(pairs: list[dict], threshold: float) -> dict:
    """Recall at/above the threshold, drops below it, and per edit rate."""
    above = [x for x in pairs if x["jaccard"] >= threshold]
    below = [x for x in pairs if x["jaccard"] < threshold]
    by_rate = {}
    for r in EDIT_RATES:
        group = [x for x in pairs if x["rate"] == r]
        by_rate[str(r)] = {
            "copies": len(group),
            "mean_jaccard": round(sum(x["jaccard"] for x in group) / max(1, len(group)), 3),
            "dropped": sum(x["dropped"] for x in group),
        }
    return {
        "recall_at_or_above_threshold": f"{sum(x['dropped'] for x in above)}/{len(above)}",
        "dropped_below_threshold": f"{sum(x['dropped'] for x in below)}/{len(below)}",
        "by_edit_rate": by_rate,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.data.decontam",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--english", type=Path, required=True, help="blank-line-separated English")
    p.add_argument("--chinese", type=Path, required=True, help="Chinese, a paragraph a line")
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument("--validation_fraction", type=float, default=0.02)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from bertforge.data_prep.worker import is_validation

    frac = args.validation_fraction
    docs = read_documents(args.english, args.chinese)
    val, pairs = plant(docs, frac)
    train_docs = [d for d in docs if not is_validation(d, frac)] + [x["copy"] for x in pairs]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "planted.txt"
        corpus.write_text("\n".join(docs + [x["copy"] for x in pairs]) + "\n", encoding="utf-8")
        timed_build(corpus, Path(tmp) / "plain", frac, vocab_size=16000)  # the tokenizer
        tok = Path(tmp) / "plain" / "tokenizer"
        plain_s, _ = timed_build(corpus, Path(tmp) / "plain2", frac, tokenizer=tok)
        dec_s, dec = timed_build(
            corpus, Path(tmp) / "dec", frac, tokenizer=tok, decontaminate=args.threshold
        )
        check = check_in_process(val, train_docs, args.threshold, Path(tmp))
        mb = corpus.stat().st_size / 1e6
    for x in pairs:
        x["dropped"] = x["copy"] not in check["kept"]
    d = dec["decontamination"]
    if check["dropped"] != d["train_documents_dropped"]:
        raise SystemExit(
            f"the in-process check dropped {check['dropped']}, the build "
            f"{d['train_documents_dropped']}"
        )
    result = {
        "corpus_mb": round(mb, 2),
        "documents": len(docs),
        "validation_documents": len(val),
        "planted": len(pairs),
        "threshold": args.threshold,
        "build_seconds_without": round(plain_s, 2),
        "build_seconds_with": round(dec_s, 2),
        "manifest": {
            k: d[k]
            for k in (
                "validation_documents_indexed",
                "train_documents_checked",
                "train_documents_dropped",
            )
        },
        "check_mb_per_s_one_core": round(check["mb_per_s"], 2),
        "check_mb_per_cpu_second": round(check["mb_per_cpu_s"], 2),
        "load_average": round(os.getloadavg()[0], 1),
        "index_seconds": round(check["index_seconds"], 2),
        **summarise(pairs, args.threshold),
        "dropped_not_planted": check["dropped"] - sum(x["dropped"] for x in pairs),
    }
    print(json.dumps(result, indent=1, ensure_ascii=False))
    if args.json:
        write_json_atomic(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
