"""`bertforge prep extend-tokenizer`: add domain tokens to a BERT WordPiece tokenizer.

The contract the trainer's `--init_from` relies on (pretrain/model/init_from.py):
- every id of the base tokenizer keeps its token, except BERT's `[unused*]` vocabulary slots,
  which are filled first (in id order); the remaining new tokens are appended after the base
  vocabulary, so the model's old embedding rows keep their meaning;
- a new token that BERT's normalizer and pre-tokenizer keep as one word ("hypertension") becomes
  a WordPiece vocabulary entry: WordPiece's longest match then emits it whole. A term they would
  split (several words, punctuation, or Chinese characters, which BERT splits one per character)
  is also registered as an added token with the same id, matched before WordPiece runs:
  normalized (after lowercasing) and whole words only for Latin-script terms, as written for
  terms with CJK characters (BERT's normalizer puts spaces around each CJK character, so a
  normalized CJK added token would never match);
- the folder loads with `AutoTokenizer` and with `data_prep build --tokenizer`; before it is
  renamed into place, the saved folder is reloaded and every new token checked to encode as
  exactly one token with its id.

Candidates come from `--terms` (always first) and from the domain text: words the base tokenizer
splits into several pieces and, for Chinese, multi-character words from rjieba, ranked by the
tokens they save (occurrences x (pieces - 1)). Words with an [UNK] piece are not proposed: their
rows could not be initialised from their pieces.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from bertforge import logs
from bertforge.data_prep.inputs import DropCounter, InputConfig, expand_inputs, iter_documents
from bertforge.data_prep.tokenizer import TokenizerError, _lowercases, _write_hf, import_tokenizer
from bertforge.data_prep.wordstart import _CJK_RE, read_protected_terms
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.files import publish_dir, write_json_atomic
from bertforge.logs import get_logger

log = get_logger(__name__)

UNUSED_RE = re.compile(r"^\[unused\d+\]$")  # BERT's reserved vocabulary slots
REPORT_FILE = "extension_report.json"  # written next to the tokenizer files
_HAS_LETTER = re.compile(r"[^\W\d_]")


@dataclass
class NewToken:
    """One token the extension adds."""

    token: str  # vocabulary entry / added-token content
    id: int  # its id in the extended tokenizer
    kind: str  # "vocab" (WordPiece entry) or "added" (also an added token, matched first)
    source: str  # "terms" or "text"
    slot: str  # "unused" (replaced an [unused*] entry) or "appended"
    pieces: int  # tokens the base tokenizer splits it into
    count: int = 0  # occurrences as one token in the domain text, encoded with the new tokenizer
    saved: int = 0  # count * (pieces - 1): tokens it saves on the domain text


@dataclass
class ExtensionReport:
    """What `extend_tokenizer` did and measured (also saved as extension_report.json)."""

    base: str
    output: str
    base_vocab_size: int
    new_vocab_size: int
    new_tokens: list[NewToken] = field(default_factory=list)
    skipped_terms: dict[str, str] = field(default_factory=dict)  # term -> why
    before: dict[str, float] = field(default_factory=dict)  # tokens_per_char, unk_rate, tokens
    after: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def load_base(source: Path):
    """The base tokenizer as transformers loads it, after data_prep's WordPiece/specials checks."""
    # Lazy: transformers takes seconds to import; only this path needs it.
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        import_tokenizer(Path(source), None, Path(tmp) / "tok")
        return AutoTokenizer.from_pretrained(str(Path(tmp) / "tok"))


def _is_one_word(backend: Tokenizer, term: str) -> tuple[bool, str]:
    """(BERT keeps `term` as one pre-tokenized word, its normalized form)."""
    normalized = backend.normalizer.normalize_str(term) if backend.normalizer else term
    words = backend.pre_tokenizer.pre_tokenize_str(normalized)
    return len(words) == 1 and not _CJK_RE.search(term), normalized


def count_words(docs: Iterable[str], backend: Tokenizer) -> Counter[str]:
    """Occurrences of candidate words in `docs`: normalized Latin-script words, and rjieba's
    multi-character words in runs of CJK characters."""
    # Lazy: rjieba (its dictionary loads on import) only for CJK text.
    import rjieba

    counts: Counter[str] = Counter()
    for doc in docs:
        normalized = backend.normalizer.normalize_str(doc) if backend.normalizer else doc
        for word, _ in backend.pre_tokenizer.pre_tokenize_str(normalized):
            if len(word) > 1 and _HAS_LETTER.search(word) and not _CJK_RE.search(word):
                counts[word] += 1
        for run in re.findall(f"{_CJK_RE.pattern}{{2,}}", doc):
            counts.update(w for w in rjieba.cut(run) if len(w) > 1)
    return counts


def _pieces(backend: Tokenizer, words: list[str]) -> list[list[int]]:
    return [e.ids for e in backend.encode_batch(words, add_special_tokens=False)]


def rank_candidates(
    counts: Counter[str], backend: Tokenizer, unk_id: int, min_frequency: int, min_pieces: int
) -> list[tuple[str, int, int]]:
    """(word, count, pieces) of frequent words split into >= min_pieces pieces, most tokens
    saved first."""
    words = sorted(w for w, c in counts.items() if c >= min_frequency)
    ranked = []
    for word, ids in zip(words, _pieces(backend, words)):
        if len(ids) >= min_pieces and unk_id not in ids:
            ranked.append((word, counts[word], len(ids)))
    ranked.sort(key=lambda r: (-r[1] * (r[2] - 1), r[0]))
    return ranked


def _unused_slots(spec: dict[str, Any]) -> list[int]:
    """Ids of [unused*] WordPiece entries that are not registered as added tokens."""
    added = {a["content"] for a in spec.get("added_tokens", [])}
    vocab = spec["model"]["vocab"]
    return sorted(i for t, i in vocab.items() if UNUSED_RE.match(t) and t not in added)


def _choose(
    terms: list[str],
    ranked: list[tuple[str, int, int]],
    backend: Tokenizer,
    max_new: int,
    report: ExtensionReport,
) -> list[tuple[str, str, str, int]]:
    """(content, kind, source, pieces) of the tokens to add, terms first."""
    chosen: dict[str, tuple[str, str, str, int]] = {}
    vocab = backend.get_vocab(with_added_tokens=True)
    for term in terms:
        one_word, normalized = _is_one_word(backend, term)
        content = normalized if one_word or not _CJK_RE.search(term) else term
        content = " ".join(content.split())
        n_pieces = len(_pieces(backend, [content])[0])
        if content in vocab or n_pieces <= 1:
            report.skipped_terms[term] = "already one token of the base tokenizer"
            continue
        kind = "vocab" if one_word else "added"
        chosen.setdefault(content, (content, kind, "terms", n_pieces))
    if len(chosen) > max_new:
        raise TokenizerError(
            f"--terms gives {len(chosen)} new tokens, more than --max_new "
            f"{max_new}; raise --max_new or shorten the terms file."
        )
    for word, _count, n_pieces in ranked:
        if len(chosen) >= max_new:
            break
        if word not in chosen:
            kind = "added" if _CJK_RE.search(word) else "vocab"
            chosen[word] = (word, kind, "text", n_pieces)
    return list(chosen.values())


def build_extended(
    base_backend: Tokenizer, chosen: list[tuple[str, str, str, int]]
) -> tuple[Tokenizer, list[NewToken]]:
    """The extended `tokenizers.Tokenizer`: [unused*] slots first, then appended ids."""
    spec = json.loads(base_backend.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    slots = _unused_slots(spec)
    next_id = base_backend.get_vocab_size(with_added_tokens=True)
    new_tokens, added = [], []
    for k, (content, kind, source, n_pieces) in enumerate(chosen):
        if k < len(slots):
            tid, slot = slots[k], "unused"
            del vocab[by_id[tid]]
        else:
            tid, slot, next_id = next_id, "appended", next_id + 1
        vocab[content] = tid
        if kind == "added":
            cjk = bool(_CJK_RE.search(content))
            added.append(AddedToken(content, single_word=not cjk, normalized=not cjk))
        new_tokens.append(NewToken(content, tid, kind, source, slot, n_pieces))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_tokens(added)  # the content is already in the vocabulary: the id is kept
    return tok, new_tokens


def _save(base_hf, tok: Tokenizer, output: Path) -> None:
    """Save into the folder ``output`` as an HF tokenizer with the base's special tokens and
    casing."""
    # Lazy: transformers takes seconds to import; only this path needs it.
    from transformers import BertTokenizerFast

    normalizer = json.loads(tok.to_str()).get("normalizer")
    hf = BertTokenizerFast(
        tokenizer_object=tok,
        do_lower_case=_lowercases(normalizer),
        **{
            k: getattr(base_hf, k)
            for k in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
        },
    )
    _write_hf(hf, output)


def check_one_token_each(folder: Path, new_tokens: list[NewToken]) -> None:
    """Reload `folder` with AutoTokenizer; every new token must encode as its one id."""
    # Lazy: transformers takes seconds to import; only this path needs it.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    bad = []
    for t in new_tokens:
        ids = tok(t.token, add_special_tokens=False)["input_ids"]
        if ids != [t.id]:
            bad.append(f"{t.token!r} -> {tok.convert_ids_to_tokens(ids)} (expected id {t.id})")
    if bad:
        raise TokenizerError(
            f"{folder}: the saved tokenizer does not encode these new tokens as "
            f"one token: {bad[:5]}. This is a bug; please report it."
        )


def _batches(docs: Iterable[str], size: int = 1000) -> Iterable[list[str]]:
    batch: list[str] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def text_stats(
    tok: Tokenizer, docs: Iterable[str], unk_id: int
) -> tuple[dict[str, float], Counter]:
    """Tokens per character and [UNK] rate of `tok` on `docs`, and how often each id occurs."""
    ids: Counter[int] = Counter()
    chars = 0
    for batch in _batches(docs):
        chars += sum(len(d) for d in batch)
        for enc in tok.encode_batch_fast(batch, add_special_tokens=False):
            ids.update(enc.ids)
    tokens = sum(ids.values())
    stats = {
        "tokens": tokens,
        "characters": chars,
        "tokens_per_char": tokens / max(chars, 1),
        "unk_rate": ids[unk_id] / max(tokens, 1),
    }
    return stats, ids


@dataclass(frozen=True)
class ExtendConfig:
    """Arguments of `bertforge prep extend-tokenizer`."""

    tokenizer: Path  # base HF tokenizer folder or BERT vocab.txt
    inputs: tuple[str, ...]  # domain text files, folders, globs (as `build --input`)
    output: Path  # new HF tokenizer folder (must not exist)
    terms: Path | None = None  # domain terms, one per line, added whole first
    max_new: int = 1000  # most new tokens in all (terms included)
    min_frequency: int = 5  # a word from the text must occur this often
    min_pieces: int = 2  # ... and be split into at least this many base pieces
    input: InputConfig = field(default_factory=InputConfig)


def extend_tokenizer(cfg: ExtendConfig) -> ExtensionReport:
    """Propose, add and verify domain tokens; write cfg.output; returns the report."""
    if cfg.output.exists():
        raise TokenizerError(f"--output {cfg.output} already exists; choose a new folder.")
    if cfg.max_new < 1 or cfg.min_pieces < 2 or cfg.min_frequency < 1:
        raise TokenizerError("--max_new and --min_frequency must be >= 1, --min_pieces >= 2.")
    base_hf = load_base(cfg.tokenizer)
    base = base_hf.backend_tokenizer
    terms = read_protected_terms(cfg.terms) if cfg.terms else []
    files = expand_inputs(list(cfg.inputs))

    def docs(quiet: bool = True) -> Iterable[str]:  # streamed: the text is read three times
        return iter_documents(files, cfg.input, DropCounter(quiet=quiet))

    counts = count_words(docs(quiet=False), base)
    if not counts:
        raise TokenizerError(f"--input {' '.join(cfg.inputs)}: no words found in the text.")
    unk_id = base_hf.unk_token_id
    ranked = rank_candidates(counts, base, unk_id, cfg.min_frequency, cfg.min_pieces)
    report = ExtensionReport(
        str(cfg.tokenizer), str(cfg.output), base.get_vocab_size(with_added_tokens=True), 0
    )
    chosen = _choose(terms, ranked, base, cfg.max_new, report)
    tok, report.new_tokens = build_extended(base, chosen)
    report.new_vocab_size = tok.get_vocab_size(with_added_tokens=True)
    report.before, _ = text_stats(base, docs(), unk_id)
    report.after, occurrences = text_stats(tok, docs(), unk_id)
    for t in report.new_tokens:
        t.count, t.saved = occurrences[t.id], occurrences[t.id] * (t.pieces - 1)
    with publish_dir(cfg.output) as tmp:  # a failed check publishes nothing
        _save(base_hf, tok, tmp)
        check_one_token_each(tmp, report.new_tokens)
        write_json_atomic(tmp / REPORT_FILE, report.to_dict())
    return report


def report_lines(report: ExtensionReport, show: int = 20) -> list[str]:
    """Human summary, one string per line."""
    n = report.new_tokens
    unused = sum(t.slot == "unused" for t in n)
    out = [
        f"added {len(n)} tokens ({unused} in [unused*] slots, {len(n) - unused} appended): "
        f"vocabulary {report.base_vocab_size} -> {report.new_vocab_size}"
    ]
    out += [
        f"  {t.id:>6} {t.token!r:<28} {t.kind:<5} {t.source:<5} {t.count:>7} x {t.pieces} pieces"
        for t in n[:show]
    ]
    if len(n) > show:
        out.append(f"  ... {len(n) - show} more in {report.output}/{REPORT_FILE}")
    out += [f"  term {term!r} skipped: {why}" for term, why in report.skipped_terms.items()]
    b, a = report.before, report.after
    out.append(
        f"tokens per character: {b['tokens_per_char']:.4f} -> {a['tokens_per_char']:.4f} "
        f"({b['tokens']:,} -> {a['tokens']:,} tokens); [UNK] rate {b['unk_rate']:.4%} -> "
        f"{a['unk_rate']:.4%}"
    )
    return [*out, f"wrote {report.output}"]


def add_parser(sub) -> None:
    """The `extend-tokenizer` subcommand of `bertforge prep`."""
    e = sub.add_parser(
        "extend-tokenizer",
        help="add domain terms and frequent domain words to a "
        "BERT tokenizer ([unused*] slots first), for continued pretraining",
    )
    e.add_argument(
        "--tokenizer",
        required=True,
        type=Path,
        help="base HF tokenizer folder (the checkpoint's) or BERT vocab.txt",
    )
    e.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help="domain text: files, folders, globs (as `build --input`)",
    )
    e.add_argument("--output", required=True, type=Path, help="new tokenizer folder")
    e.add_argument("--terms", type=Path, help="domain terms, one per line, each added whole")
    e.add_argument("--max_new", type=int, default=1000, help="most new tokens (terms included)")
    e.add_argument(
        "--min_frequency",
        type=int,
        default=5,
        help="occurrences a word of the text needs to be proposed",
    )
    e.add_argument(
        "--min_pieces",
        type=int,
        default=2,
        help="base pieces a word of the text must be split into to be proposed",
    )
    e.add_argument("--text_field", default="text", help="jsonl key / parquet column")
    e.add_argument(
        "--one_doc_per_line",
        action="store_true",
        help="text files: one document per line (default: blank-line-separated blocks)",
    )


def run_command(args) -> int:
    """Run the parsed `extend-tokenizer` command; 2 on bad input."""
    cfg = ExtendConfig(
        tokenizer=args.tokenizer,
        inputs=tuple(args.input),
        output=args.output,
        terms=args.terms,
        max_new=args.max_new,
        min_frequency=args.min_frequency,
        min_pieces=args.min_pieces,
        input=InputConfig(text_field=args.text_field, one_doc_per_line=args.one_doc_per_line),
    )
    try:
        logs.report(report_lines(extend_tokenizer(cfg)))
    except UserError as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    return 0
