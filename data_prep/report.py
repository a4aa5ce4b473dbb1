"""`inspect` (counts, length histogram, decoded samples with their whole-word units and
protected-term occurrences marked, per-term occurrence counts) and `verify` (every checksum)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data_prep.layout import MANIFEST, TOKENIZER_DIR
from bertforge.data_prep.reader import ShardError, ShardReader, check_file, load_manifest
from bertforge.data_prep.tokenizer import TokenizerError, describe
from bertforge.logs import get_logger

log = get_logger(__name__)


def summary(
    root: Path,
    samples: int = 3,
    bins: int = 8,
    terms_file: Path | None = None,
    term_scan: int = 10000,
) -> dict[str, Any]:
    """Counts per split, a sequence-length histogram and a few decoded sequences (``marked``: the
    tokens with units and term occurrences marked, see :mod:`data_prep.unit_marks`); with
    protected terms (``terms_file``, else the build's own file), each term's occurrences in the
    first ``term_scan`` sequences of each split."""
    from tokenizers import Tokenizer

    from bertforge.data_prep.unit_marks import TermMatcher, count_terms, resolve_terms_file
    from bertforge.data_prep.wordstart import read_protected_terms

    manifest = load_manifest(root)
    tok = Tokenizer.from_file(str(root / TOKENIZER_DIR / "tokenizer.json"))
    terms_path, terms_warning = resolve_terms_file(root, manifest, terms_file)
    matcher = TermMatcher(read_protected_terms(terms_path), tok) if terms_path else None
    out: dict[str, Any] = {
        "root": str(root),
        "format": manifest["format"],
        "max_seq_len": manifest["max_seq_len"],
        "tokenizer": manifest["tokenizer"],
        "token_dtype": manifest["token_dtype"],
        "dropped": manifest["dropped"],
        "bad_records": bad_records(manifest),
        "splits": {},
    }
    if "decontamination" in manifest:
        out["decontamination"] = manifest["decontamination"]
    if manifest.get("key_sentences") is not None:
        out["key_sentences"] = {
            "share": manifest["key_sentences"],
            **manifest["key_sentences_kept"],
        }
    shard_bytes, readers = 0, {}
    for split, info in manifest["splits"].items():
        reader = readers[split] = ShardReader(root, split)
        entry = _split_entry(manifest, info, reader, bins)
        shard_bytes += entry["bytes"]
        entry["samples"] = _decoded_samples(reader, samples, tok, matcher)
        out["splits"][split] = entry
    out["shard_bytes"] = shard_bytes
    if matcher is not None:
        out["protected_terms"] = {
            "file": str(terms_path),
            **count_terms(matcher, readers, term_scan),
        }
    if terms_warning:
        out["protected_terms_warning"] = terms_warning
    return out


def _split_entry(
    manifest: dict[str, Any], info: dict[str, Any], reader: ShardReader, bins: int
) -> dict[str, Any]:
    """One split's counts, bytes, sequence-length histogram (``bins`` bins up to max_seq_len)
    and, for NSP shards, the share of random next sentences."""
    lengths = reader.sequence_lengths()
    entry: dict[str, Any] = {k: info[k] for k in ("documents", "sequences", "tokens")}
    entry["shards"] = len(info["shards"])
    entry["bytes"] = sum(f["bytes"] for s in info["shards"] for f in s["files"].values())
    entry["bytes_per_token"] = round(entry["bytes"] / max(info["tokens"], 1), 4)
    if len(lengths):
        edges = np.linspace(0, manifest["max_seq_len"], bins + 1).round().astype(int)
        hist, _ = np.histogram(lengths, bins=edges)
        entry["length_histogram"] = [
            {"from": int(a), "to": int(b), "sequences": int(c)}
            for a, b, c in zip(edges[:-1], edges[1:], hist)
        ]
        entry["mean_length"] = round(float(lengths.mean()), 2)
    if manifest["format"] == "nsp" and len(reader):
        labels = reader.nsp_labels()
        entry["random_next_share"] = round(float(labels.mean()), 4)
    return entry


def _decoded_samples(reader: ShardReader, samples: int, tok, matcher) -> list[dict[str, Any]]:
    """``samples`` sequences spread evenly over a split, decoded, and marked (units and term
    occurrences, when ``matcher`` finds terms)."""
    from bertforge.data_prep.unit_marks import mark_tokens

    picks = np.linspace(0, len(reader) - 1, min(samples, len(reader))).astype(int)
    out = []
    for i in picks:
        s = reader[int(i)]
        ids = s.input_ids.astype(np.int64)
        marked = mark_tokens(
            [tok.id_to_token(int(t)) for t in ids],
            s.word_start,
            matcher.find(ids) if matcher else [],
        )
        out.append(
            {
                "index": int(i),
                "length": len(s.input_ids),
                "text": tok.decode(s.input_ids.tolist(), skip_special_tokens=False),
                "marked": marked,
            }
        )
    return out


def bad_records(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `bad_records` (built from `dropped` for manifests written before it)."""
    if "bad_records" in manifest:
        return manifest["bad_records"]
    dropped = manifest.get("dropped", {})
    return {"count": sum(dropped.values()), "by_reason": dropped, "examples": []}


def bad_records_line(bad: dict[str, Any]) -> str:
    """One line: how many input records were skipped, by reason, and the first one."""
    if not bad["count"]:
        return "bad records: none"
    reasons = ", ".join(f"{k} {v:,}" for k, v in bad["by_reason"].items())
    first = bad["examples"][0] if bad["examples"] else None
    where = f"; first: {first['where']}: {first['detail']}" if first else ""
    return f"bad records: {bad['count']:,} skipped ({reasons}){where}"


def summary_lines(s: dict[str, Any]) -> list[str]:
    """Human-readable form of `summary`, one string per line (for ``bertforge.logs.report``)."""
    out = [
        f"{s['root']}: format {s['format']}, max_seq_len {s['max_seq_len']}, vocab "
        f"{s['tokenizer']['vocab_size']} ({s['token_dtype']}), {s['shard_bytes']:,} shard bytes",
        bad_records_line(s["bad_records"]),
    ]
    out += [
        f"  {e['where']}: {e['detail']} [{e['reason']}]" for e in s["bad_records"]["examples"][1:5]
    ]
    if "decontamination" in s:
        d = s["decontamination"]
        out.append(
            f"decontamination (MinHash, {d['shingle']}-word shingles, Jaccard >= "
            f"{d['threshold']}): {d['train_documents_dropped']:,} of "
            f"{d['train_documents_checked']:,} training documents "
            f"({d['train_characters_dropped']:,} characters) dropped as near-duplicates of "
            f"{d['validation_documents_indexed']:,} "
            "validation documents"
        )
        out += [
            f"  {e['jaccard']:.2f}  train: {e['train']!r}\n        validation: {e['validation']!r}"
            for e in d["examples"][:3]
        ]
    if "key_sentences" in s:
        k = s["key_sentences"]
        out.append(
            f"key sentences (TextRank, share {k['share']}): {k['documents_shortened']:,} of "
            f"{k['documents_over_length']:,} documents over max_seq_len shortened, keeping "
            f"{k['sentences_kept']:,} of {k['sentences_before']:,} sentences and "
            f"{k['tokens_kept']:,} of {k['tokens_before']:,} tokens"
        )
    for split, e in s["splits"].items():
        out += _split_lines(split, e)
    return out + _terms_lines(s)


def _split_lines(split: str, e: dict[str, Any]) -> list[str]:
    out = [
        f"\n[{split}] {e['documents']:,} documents, {e['sequences']:,} sequences, "
        f"{e['tokens']:,} tokens, {e['shards']} shards, {e['bytes_per_token']} bytes/token"
    ]
    if "random_next_share" in e:
        out.append(f"  is_random_next share: {e['random_next_share']}")
    out += [
        f"  length {h['from']:>5}-{h['to']:<5} {h['sequences']:>10,}"
        for h in e.get("length_histogram", [])
    ]
    if e["samples"]:
        out.append("  samples: ⟦...⟧ one whole-word unit, «...» a protected term (¦: split there)")
    for smp in e["samples"]:
        text = smp["marked"] if len(smp["marked"]) < 600 else smp["marked"][:600] + " ..."
        out.append(f"  #{smp['index']} ({smp['length']} tokens): {text}")
    return out


def _terms_lines(s: dict[str, Any], top: int = 30) -> list[str]:
    """Per-term counts, most frequent first, and the terms never found."""
    if "protected_terms_warning" in s:
        log.warning(s["protected_terms_warning"])
    pt = s.get("protected_terms")
    if not pt:
        return []
    scanned = ", ".join(f"{n:,} {split}" for split, n in pt["scanned_sequences"].items())
    out = [
        f"\nprotected terms ({pt['file']}, {len(pt['terms'])} terms) in the first sequences "
        f"({scanned}): occurrences (kept whole)"
    ]
    found = sorted(
        ((c["occurrences"], t, c["whole"]) for t, c in pt["terms"].items() if c["occurrences"]),
        reverse=True,
    )
    out += [f"  {n:>8,} ({whole:,})  {term}" for n, term, whole in found[:top]]
    if len(found) > top:
        out.append(f"  ... {len(found) - top} more terms found")
    if pt["not_found"]:
        shown = ", ".join(pt["not_found"][:top])
        more = f" ... ({len(pt['not_found'])} in all)" if len(pt["not_found"]) > top else ""
        out.append(f"  not found: {shown}{more}")
    return out


def verify(root: Path) -> list[str]:
    """Recheck every shard file's size and sha256 and the tokenizer fingerprint.

    Returns the checked file names; raises ShardError naming the first bad file.
    """
    manifest = load_manifest(root)
    checked = []
    try:
        info = describe(root / TOKENIZER_DIR)
    except (TokenizerError, OSError, ValueError) as e:
        raise ShardError(f"{root / TOKENIZER_DIR}: {e}") from e
    if info.fingerprint != manifest["tokenizer"]["fingerprint"]:
        raise ShardError(
            f"{root / TOKENIZER_DIR}: tokenizer fingerprint differs from "
            f"{root / MANIFEST}; the tokenizer was replaced. Restore it or rebuild."
        )
    for split, sinfo in manifest["splits"].items():
        for shard in sinfo["shards"]:
            for fname, expected in shard["files"].items():
                check_file(root / split / fname, expected, "full")
                checked.append(f"{split}/{fname}")
    return checked
