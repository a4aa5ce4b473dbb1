"""`--init_from PATH`: initial weights (only) from a Hugging Face BERT or ModernBERT folder or one
of our runs.

Where PATH points, its architecture and its tensors are :mod:`pretrain.model.init_source`; this
module plans the vocabulary and loads the weights (a run's ZeRO-2 or ZeRO-3 shards are
consolidated with `pretrain.run_folder.run_checkpoints.consolidated_state_dict`).

The contract:
- the architecture comes from the checkpoint (`read_init_config`); fields the user gave
  explicitly that disagree are listed by `architecture_conflicts`;
- `load_initial_weights` fills the plain module *before* `deepspeed.initialize` (so ZeRO-2 and
  ZeRO-3 simply partition already-loaded weights), copying every tensor of matching shape and
  reporting keys loaded, newly initialised (left as the model initialised them) and ignored;
  any other shape mismatch is an error, and so are position embeddings shorter than the shards'
  sequences (BERT; ModernBERT's rotary positions have no table: a longer run is a context
  extension, said in the report with the rope thetas that differ from the checkpoint's);
- the names loaded specially (word embeddings, MLM bias, tied copies) are per arch (its spec's
  adapter, `pretrain.model.specs.StateDictAdapter`);
- vocabulary: the shards' tokenizer must be the checkpoint's, or an extension of it in which
  every old token keeps its id and new tokens fill `[unused*]` slots or are appended (what
  `bertforge prep extend-tokenizer` writes). Old rows are copied bit for bit; each new row
  of the word embeddings (tied to the MLM decoder) and of the MLM bias is the mean of the rows of
  the pieces the checkpoint's tokenizer splits the new token into (transformers PR #14709:
  random rows distort the model). Anything else is refused with the first differing entries.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from bertforge.data_prep.tokenizer import plain_encoding
from bertforge.logs import get_logger
from bertforge.pretrain.model.init_pair import pair_state_dict
from bertforge.pretrain.model.init_source import (
    InitError,
    InitSource,
    canonical_keys,
    check_arch,
    check_positions,
    locate,
    read_hf_weights,
)
from bertforge.pretrain.model.registry import ARCHES
from bertforge.pretrain.model.rtd import ReplacedTokenDetection
from bertforge.pretrain.model.specs import StateDictAdapter
from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

log = get_logger(__name__)


_UNUSED_RE = re.compile(r"^\[unused\d+\]$")


@dataclass
class InitReport:
    """What `load_initial_weights` did; JSON-ready for the run's config.json."""

    source: str
    kind: str
    checkpoint: str
    loaded: list[str] = field(default_factory=list)
    newly_initialised: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    vocabulary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the run's config.json key "init_from")."""
        return asdict(self)

    def summary(self) -> str:
        """One paragraph for the rank-0 console (one log line per line)."""
        v = self.vocabulary
        new = f" {self.newly_initialised}" if self.newly_initialised else ""
        ignored = f" {self.ignored}" if self.ignored else ""
        head = (
            f"initialised from {self.source} ({self.kind}): {len(self.loaded)} "
            f"tensors loaded, {len(self.newly_initialised)} newly initialised{new}, "
            f"{len(self.ignored)} ignored{ignored}"
        )
        vocab = (
            f"vocabulary: {v.get('relation')}, {v.get('new_count', 0)} new rows "
            "initialised as the mean of their base pieces"
        )
        lines = [head, vocab]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _tokenizer(folder: Path, quiet: bool = False):
    """The `tokenizers.Tokenizer` of an HF tokenizer folder (tokenizer.json or vocab.txt);
    ``quiet``: a second load within one --init_from, which has said its warning already."""
    if (folder / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    else:
        # Lazy: transformers takes seconds to import; only this path needs it.
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(folder)).backend_tokenizer
        except Exception as e:  # transformers raises many types for a bad folder
            raise InitError(f"tokenizer {folder} does not load ({type(e).__name__}: {e}).") from e
    switched_off = plain_encoding(tok)  # padding would put [PAD] rows into a new token's mean
    if switched_off and not quiet:
        log.warning(
            f"tokenizer {folder}: {' and '.join(switched_off)} switched on in its file; "
            "turned off for the vocabulary check"
        )
    return tok


def _id_to_token(tok, where: Path) -> list[str]:
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted((i, t) for t, i in vocab.items())
    if [i for i, _ in by_id] != list(range(len(by_id))):
        raise InitError(f"tokenizer {where}: its ids are not 0..{len(by_id) - 1} without gaps.")
    return [t for _, t in by_id]


@dataclass
class VocabPlan:
    """How the shards' vocabulary relates to the checkpoint's, and the pieces of each new token."""

    relation: str  # "identical" or "extension"
    base_size: int  # tokens of the checkpoint's tokenizer
    new_size: int  # tokens of the shards' tokenizer
    pieces: dict[int, list[int]]  # new id -> ids of its pieces under the checkpoint's tokenizer
    tokens: dict[int, str]  # new id -> token
    unused_filled: int  # how many new tokens took an [unused*] slot


def _difference_error(base: list[str], new: list[str], base_dir: Path, new_dir: Path) -> InitError:
    diffs = [
        f"id {i}: checkpoint {b!r}, shards {n!r}"
        for i, (b, n) in enumerate(zip(base, new))
        if b != n and not _UNUSED_RE.match(b)
    ][:5]
    if len(new) < len(base):
        diffs.append(f"the shards' vocabulary has {len(new)} entries, the checkpoint's {len(base)}")
    return InitError(
        f"the shards' tokenizer ({new_dir}) is neither the checkpoint's tokenizer "
        f"({base_dir}) nor an extension of it (every old token at its id; new tokens "
        "only in [unused*] slots or appended). First differences:\n  "
        + "\n  ".join(diffs)
        + "\nBuild the shards with `bertforge prep build "
        f"--tokenizer {base_dir}` or with a tokenizer made from it by `python -m "
        "data_prep extend-tokenizer`."
    )


def _pieces(base_tok, vocab: dict[str, int], token: str) -> list[int]:
    """Ids the base tokenizer splits `token` into; a `##x` continuation is split greedily into
    `##` pieces as WordPiece would inside a word."""
    if not (token.startswith("##") and len(token) > 2):
        return base_tok.encode(token, add_special_tokens=False).ids
    rest, ids = token[2:], []
    while rest:
        end = next((e for e in range(len(rest), 0, -1) if "##" + rest[:e] in vocab), 0)
        if not end:
            return []
        ids.append(vocab["##" + rest[:end]])
        rest = rest[end:]
    return ids


def plan_vocabulary(base_dir: Path, shards_dir: Path) -> VocabPlan:
    """Compare the checkpoint's tokenizer with the shards'; InitError unless identical or an
    extension (see module doc)."""
    base_tok, new_tok = _tokenizer(base_dir), _tokenizer(shards_dir)
    base, new = _id_to_token(base_tok, base_dir), _id_to_token(new_tok, shards_dir)
    if len(new) < len(base) or any(b != n and not _UNUSED_RE.match(b) for b, n in zip(base, new)):
        raise _difference_error(base, new, base_dir, shards_dir)
    for part in ("normalizer", "pre_tokenizer"):
        a, b = (json.loads(t.to_str()).get(part) for t in (base_tok, new_tok))
        if a != b:
            raise InitError(
                f"the shards' tokenizer ({shards_dir}) has another {part} than the "
                f"checkpoint's ({base_dir}): {b} vs {a}. The same ids would stand for "
                "differently prepared text; build the shards with the checkpoint's "
                "tokenizer or an extension of it."
            )
    new_ids = [i for i, b in enumerate(base) if b != new[i]] + list(range(len(base), len(new)))
    vocab = base_tok.get_vocab(with_added_tokens=True)
    pieces = {i: _pieces(base_tok, vocab, new[i]) for i in new_ids}
    empty = [new[i] for i, p in pieces.items() if not p]
    if empty:
        raise InitError(
            f"new tokens of {shards_dir} that the checkpoint's tokenizer {base_dir} "
            f"cannot split into pieces: {empty[:5]}."
        )
    relation = "extension" if new_ids else "identical"
    unused = sum(1 for i in new_ids if i < len(base))
    return VocabPlan(relation, len(base), len(new), pieces, {i: new[i] for i in new_ids}, unused)


def _source_state_dict(src: InitSource) -> tuple[dict[str, torch.Tensor], Path]:
    if src.kind != "run":  # a transformers folder, or a sentence-transformers one's encoder
        sd, file = read_hf_weights(src.checkpoint)
    else:
        sd, file = consolidated_state_dict(src.checkpoint), src.checkpoint
    return canonical_keys(sd, src.path, src.model_fields["arch"]), file


def _dropped_parts(src: InitSource, ignored: list[str]) -> list[str]:
    """Notes on what a published encoder brings that masked-LM pretraining leaves out."""
    notes = []
    if src.kind == "sentence-transformers":
        notes.append(
            f"a sentence-transformers model: its encoder ({src.checkpoint}) initialises the "
            "model; its pooling and other modules (modules.json) are not part of a masked-LM "
            "model and are not used"
        )
    pooler = [k for k in ignored if k.startswith("bert.pooler.")]
    if pooler:
        notes.append(
            f"the source's pooler ({', '.join(pooler)}) is dropped: masked-LM pretraining does "
            "not train it, and a fine-tuned task model initialises its own"
        )
    return notes


def _gathered(model: torch.nn.Module):
    """Parameters partitioned by ZeRO-3's zero.Init (build_model does not use it today) are
    gathered for the load; rank 0's values are kept and re-partitioned on exit."""
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    # Lazy: deepspeed takes seconds to import; the commands that import this module without running
    # a job (--help, the doctor) do without it.
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)


def _untie(sd: dict[str, torch.Tensor], keys: StateDictAdapter, report: InitReport) -> None:
    """Drop the tied copies: our model ties them to another key. A file holding only the copy
    gives that key its value (HF BertForPreTraining files sometimes hold the MLM bias only as
    the decoder's bias, transformers #14630); a copy that differs is noted."""
    for tied, target in keys.tied.items():
        value = sd.pop(tied, None)
        if value is None:
            continue
        if target not in sd:
            sd[target] = value
            report.notes.append(f"{target} taken from {tied}")
        elif not torch.equal(value, sd[target]):
            report.notes.append(
                f"{tied} differs from {target} in the checkpoint; this model ties them and "
                f"uses {target}"
            )


def _context_notes(src: InitSource, config) -> list[str]:
    """A rotary arch (ModernBERT): a run with more positions than the checkpoint's (a context
    extension), and rope thetas the flags set other than the checkpoint's, said in the report."""
    f = src.model_fields
    if not ARCHES[f["arch"]].rotary:
        return []
    notes = []
    if config.max_position_embeddings > f["max_position_embeddings"]:
        notes.append(
            f"context extension: the checkpoint's max_position_embeddings is "
            f"{f['max_position_embeddings']}, this run's {config.max_position_embeddings} "
            "(rotary positions: no table to grow; positions past the checkpoint's are new to it)"
        )
    for layer, key in (
        ("full_attention", "global_rope_theta"),
        ("sliding_attention", "local_rope_theta"),
    ):
        theta = float(config.rope_parameters[layer]["rope_theta"])
        if theta != f[key]:
            notes.append(
                f"{key} {theta:g} (this run's flags) instead of the checkpoint's {f[key]:g}"
            )
    return notes


def _copy_vocab_rows(
    dst: torch.Tensor, src: torch.Tensor, plan: VocabPlan, key: str, where: Path
) -> None:
    """Old rows bit for bit; each new row the mean of its pieces' rows (float32)."""
    if src.shape[1:] != dst.shape[1:] or src.shape[0] < plan.base_size:
        raise InitError(
            f"--init_from {where}: {key} has shape {tuple(src.shape)}; this model "
            f"needs {tuple(dst.shape)} and at least {plan.base_size} rows for the "
            "checkpoint's tokenizer."
        )
    n = min(src.shape[0], dst.shape[0])
    dst[:n] = src[:n].to(dst.dtype)
    for tid, ids in plan.pieces.items():
        dst[tid] = src[ids].to(torch.float32).mean(0).to(dst.dtype)


def _vocab_report(plan: VocabPlan, base_dir: Path, shards_dir: Path, base_tok) -> dict[str, Any]:
    listed = [
        {
            "id": i,
            "token": plan.tokens[i],
            "pieces": [base_tok.id_to_token(p) for p in plan.pieces[i]],
        }
        for i in sorted(plan.pieces)[:200]
    ]
    return {
        "relation": plan.relation,
        "checkpoint_tokenizer": str(base_dir),
        "shards_tokenizer": str(shards_dir),
        "checkpoint_tokens": plan.base_size,
        "shards_tokens": plan.new_size,
        "new_count": len(plan.pieces),
        "unused_slots_filled": plan.unused_filled,
        "appended": len(plan.pieces) - plan.unused_filled,
        "new_tokens": listed,
    }


def _adapter(model: torch.nn.Module, path: str | Path) -> StateDictAdapter:
    """The names loaded specially: the arch's adapter, or an RTD pair's own (``init_adapter``)."""
    if not isinstance(model, ReplacedTokenDetection):
        return ARCHES[model.arch].adapter
    if not hasattr(model, "init_adapter"):
        raise InitError(
            f"--init_from {path} with --objective rtd: not supported yet for "
            f"--arch {model.arch} (BERT's ELECTRA pair takes ELECTRA, BERT and run folders)"
        )
    return model.init_adapter


def _weights_and_report(
    model: torch.nn.Module, src: InitSource, path: str | Path
) -> tuple[dict[str, torch.Tensor], InitReport]:
    """The source's tensors under the model's names, and the report begun: for an RTD pair the
    discriminator from ``path`` and the generator from its own folder (init_pair)."""
    if not isinstance(model, ReplacedTokenDetection):
        sd, file = _source_state_dict(src)
        return sd, InitReport(str(path), src.kind, str(file))
    sd, file, gen = pair_state_dict(src, model.generator_from)
    report = InitReport(str(path), src.kind, str(file))
    report.notes.append(
        f"generator from {gen}" if gen else "no generator folder: the generator starts anew"
    )
    return sd, report


def load_initial_weights(
    model: torch.nn.Module,
    path: str | Path,
    *,
    tokenizer_dir_of_shards: str | Path,
    max_seq_len: int | None = None,
    base_tokenizer_dir: str | Path | None = None,
) -> InitReport:
    """Fill `model` (pretrain.model.bert.BertForPretrainingMasked or the ModernBERT one, before
    deepspeed.initialize) from --init_from `path`; returns what was loaded, newly initialised
    and ignored. A source of another arch than the model's is an InitError.

    tokenizer_dir_of_shards: the shard folder's tokenizer/. max_seq_len: the shards'.
    base_tokenizer_dir: the checkpoint's tokenizer when its folder has none.
    """
    src = locate(path)
    check_arch(src, model.arch)
    keys = _adapter(model, path)
    base_dir = Path(base_tokenizer_dir) if base_tokenizer_dir else src.tokenizer_dir
    if base_dir is None:
        raise InitError(
            f"--init_from {path}: no tokenizer there (tokenizer.json or vocab.txt), "
            "so the shards' token ids cannot be checked against the checkpoint's. "
            "Copy the checkpoint's tokenizer files into that folder."
        )
    shards_dir = Path(tokenizer_dir_of_shards)
    plan = plan_vocabulary(base_dir, shards_dir)
    sd, report = _weights_and_report(model, src, path)
    if keys.word_emb not in sd:
        raise InitError(
            f"--init_from {path}: {report.checkpoint} has no {keys.word_emb} (nor embeddings.* "
            f"without prefix); not a {ARCHES[model.arch].display_name} checkpoint."
        )
    if keys.pos_emb is not None and keys.pos_emb in sd:
        check_positions(int(sd[keys.pos_emb].shape[0]), max_seq_len, Path(path))
    _untie(sd, keys, report)
    disagree = model.shared_copies_disagree(sd) if model.shares_layers else None
    if disagree:  # --share_layers: copying layer by layer would keep the last layer's weights
        raise InitError(f"--init_from {path}: {disagree}")
    used: set[str] = set()
    mismatched = []
    with torch.no_grad(), _gathered(model):
        for key, dst in model.state_dict().items():
            if key in keys.tied:
                continue
            if key not in sd:
                report.newly_initialised.append(key)
                continue
            used.add(key)
            if key in (keys.word_emb, keys.mlm_bias):
                _copy_vocab_rows(dst, sd[key], plan, key, Path(path))
            elif sd[key].shape != dst.shape:
                mismatched.append(
                    f"{key}: checkpoint {tuple(sd[key].shape)}, model {tuple(dst.shape)}"
                )
                continue
            else:
                dst.copy_(sd[key].to(dst.dtype))
            report.loaded.append(key)
    if mismatched:
        raise InitError(
            f"--init_from {path}: shapes differ from the model built from its "
            "config:\n  " + "\n  ".join(mismatched)
        )
    report.ignored = sorted(set(sd) - used)
    report.notes += _dropped_parts(src, report.ignored) + _context_notes(src, model.config)
    base_tok = _tokenizer(base_dir, quiet=True)  # plan_vocabulary loaded and warned already
    report.vocabulary = _vocab_report(plan, base_dir, shards_dir, base_tok)
    unk = base_tok.token_to_id("[UNK]")
    with_unk = [plan.tokens[i] for i, ids in plan.pieces.items() if unk in ids]
    if with_unk:
        report.notes.append(
            f"{len(with_unk)} new tokens have [UNK] among their base pieces, so the [UNK] row "
            f"enters their mean: {with_unk[:10]}"
        )
    return report
