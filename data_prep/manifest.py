"""The manifest of a finished build, written last: splits, shards, tokenizer, bad records,
decontamination and key-sentence counts (docs/design.md section 1 lists its keys)."""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bertforge.data_prep.decontam import sum_stats
from bertforge.data_prep.inputs import MAX_BAD_EXAMPLES
from bertforge.data_prep.key_sentences import KeptCounts
from bertforge.data_prep.layout import FORMAT_VERSION, SPLITS, TOKENIZER_DIR, token_dtype_for
from bertforge.data_prep.tokenizer import describe


def build_manifest(out: Path, key: dict, records: list[dict], first_part: dict) -> dict[str, Any]:
    """The manifest of a complete build from its unit records and part 0's record (input-level
    drop counts, the command and arguments)."""
    info = describe(out / TOKENIZER_DIR)
    dropped = Counter(first_part["input_dropped"])
    for r in records:
        dropped.update(r["dropped"])
    splits = {}
    for split in SPLITS:
        parts = [r["splits"][split] for r in records]
        shards = [p["shard"] for p in parts if p["shard"]]
        splits[split] = {
            "documents": sum(p["documents"] for p in parts),
            "corpus_tokens": sum(p["corpus_tokens"] for p in parts),
            "sequences": sum(s["sequences"] for s in shards),
            "tokens": sum(s["tokens"] for s in shards),
            "shards": shards,
        }
    manifest = {
        "format_version": FORMAT_VERSION,
        "format": key["sequences"]["format"],
        "max_seq_len": key["sequences"]["max_seq_len"],
        "tokenizer": {
            "fingerprint": info.fingerprint,
            "vocab_size": info.vocab_size,
            "lowercase": info.lowercase,
        },
        "special_tokens": info.special_tokens,
        "token_dtype": token_dtype_for(info.vocab_size).name,
        "word_start": "numpy.packbits(bitorder='little'), 1 where a whole-word-masking unit "
        "starts (## continuation, rjieba words, protected terms; specials set)",
        "splits": splits,
        "dropped": dict(sorted(dropped.items())),  # = bad_records.by_reason (older readers)
        "bad_records": bad_records(dropped, first_part, records),
        "split_documents": first_part["split_documents"],
        "protected_terms": first_part["protected_terms"],
        "command": first_part["command"],
        "args": first_part["args"],
        "build_key": key,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    if "decontaminate" in key:
        total = sum_stats(r["decontamination"] for r in records)
        manifest["decontamination"] = {
            **key["decontaminate"],
            "action": "drop",
            "validation_documents_indexed": first_part["decontam_indexed"],
            "train_documents_checked": total["checked"],
            "train_documents_dropped": total["dropped"],
            "train_characters_dropped": total["dropped_characters"],
            "examples": total["examples"],
        }
    manifest["key_sentences"] = (key.get("key_sentences") or {}).get("share")
    if "key_sentences" in key:
        manifest["key_sentences_kept"] = key_sentences_kept(records)
    if first_part["num_partitions"] > 1:
        manifest["partitions"] = first_part["num_partitions"]
    return manifest


def key_sentences_kept(records: list[dict]) -> dict[str, Any]:
    """The key-sentence counts of both splits summed, with the shares they give (sentences and
    tokens kept of the documents shortened)."""
    total = KeptCounts()
    for r in records:
        for split in SPLITS:
            total.add(r["splits"][split]["key_sentences"])
    counts = asdict(total)
    return {
        **counts,
        "sentence_share_kept": _share(total.sentences_kept, total.sentences_before),
        "token_share_kept": _share(total.tokens_kept, total.tokens_before),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def bad_records(dropped: Counter, first_part: dict, records: list[dict]) -> dict[str, Any]:
    """The manifest's account of skipped input: how many, by reason, the first few with file and
    line (input-level ones first, then those of the work units in order)."""
    examples = [
        *first_part.get("input_bad_examples", ()),
        *(e for r in records for e in r.get("bad_examples", ())),
    ]
    return {
        "count": sum(dropped.values()),
        "by_reason": dict(sorted(dropped.items())),
        "examples": examples[:MAX_BAD_EXAMPLES],
    }


def no_usable_input(dropped: dict[str, int], examples: list[dict], documents: int) -> str:
    """The error of a build that has no training document, naming the first bad record."""
    if documents:
        return (
            f"all {documents} usable documents went to the validation split; lower "
            "--validation_fraction or add input."
        )
    first = f"; first: {examples[0]['where']}: {examples[0]['detail']}" if examples else ""
    return (
        f"the inputs hold no usable document ({sum(dropped.values())} bad records: "
        f"{dict(sorted(dropped.items()))}{first}); check --input, --text_field, "
        "--one_doc_per_line."
    )
