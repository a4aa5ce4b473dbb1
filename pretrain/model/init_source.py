"""Where `--init_from PATH` points and what it holds: a Hugging Face BERT folder or one of our
runs, its architecture (checked against the flags) and its tensors under our names.

PATH is a transformers folder (`BertForMaskedLM`, `BertForPreTraining` or a bare `BertModel`,
also as a sentence-transformers model publishes it: `modules.json`, `1_Pooling/`, the encoder's
folder at the top or in a module folder;
`model.safetensors`, `pytorch_model.bin` or their sharded `*.index.json` forms; keys with or
without the `bert.`, `model.` or `module.` prefixes, `LayerNorm.gamma/beta` as old TF-converted
files spell them) or a pretrain run: its folder, its `checkpoints/` folder or one `step_N` folder.

- `locate` identifies the source (errors say what was expected);
- the architecture comes from the checkpoint (`read_init_config`, `init_model_config`,
  `init_architecture`); fields the user gave explicitly that disagree are listed by
  `architecture_conflicts`;
- `read_hf_weights` and `canonical_keys` read a transformers folder's tensors.

Loading them into the model, with the vocabulary plan, is :mod:`pretrain.model.init_from`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import BertConfig

from pretrain.components.resume import (
    CheckpointError,
    CorruptCheckpointError,
    read_state,
    resolve_resume,
)
from pretrain.model.bert import _ARCH_FIELDS, ModelConfig, resolve_config

CONFLICT_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_act",
    "layer_norm_eps",
)


_HF_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


class InitError(CheckpointError):
    """An --init_from source that cannot initialise this run; the message says what to do."""


@dataclass
class InitSource:
    """Where the initial weights come from and what they are."""

    path: Path  # as given to --init_from
    kind: str  # "hf" (transformers folder), "sentence-transformers" or "run" (our checkpoint)
    checkpoint: Path  # the HF folder, or the run's step_N folder
    model_fields: dict[
        str, Any
    ]  # ModelConfig architecture fields (pretrain.model.bert._ARCH_FIELDS)
    tokenizer_dir: Path | None  # the checkpoint's tokenizer, when it has one


def _find_tokenizer(folder: Path) -> Path | None:
    has = any((folder / f).is_file() for f in ("tokenizer.json", "vocab.txt"))
    return folder if has else None


def _hf_source(path: Path, config: dict[str, Any]) -> InitSource:
    cfg_file = path / "config.json"
    if config.get("model_type") != "bert":
        raise InitError(
            f"--init_from {path}: {cfg_file} has model_type "
            f"{config.get('model_type')!r}; only BERT checkpoints (model_type "
            '"bert") can initialise this model.'
        )
    pos = config.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise InitError(
            f"--init_from {path}: position_embedding_type {pos!r} in {cfg_file}; "
            "this trainer's BERT uses absolute position embeddings only."
        )
    if not any((path / f).is_file() for f in _HF_WEIGHTS):
        raise InitError(
            f"--init_from {path}: no weights there (expected one of "
            f"{', '.join(_HF_WEIGHTS)}; TensorFlow/Flax files must be converted with "
            "transformers first)."
        )
    full = BertConfig.from_dict(config)  # keys the file omits take transformers' defaults, as there
    fields = {k: getattr(full, k) for k in _ARCH_FIELDS}
    return InitSource(path, "hf", path, fields, _find_tokenizer(path))


def _run_source(path: Path, ckpt: Path) -> InitSource:
    # Lazy: the export command's rule for where a run keeps its tokenizer (export imports the
    # checkpoint modules; importing it at the top would make the model layer depend on it).
    from pretrain.export.hf_export import _tokenizer_dir

    state = read_state(ckpt)
    vocab = int(state["vocab_size"])
    arch = state["config"]["model_cfg"].get("arch", "bert")
    if arch != "bert":
        raise InitError(
            f"--init_from {path}: {ckpt} is a --arch {arch} run; --init_from loads BERT "
            "checkpoints only (continue that run with --resume instead)."
        )
    try:
        cfg = resolve_config(ModelConfig(**state["config"]["model_cfg"]), vocab)
    except ValueError as e:
        raise InitError(f"--init_from {path}: the architecture of {ckpt}: {e}") from e
    fields = {k: getattr(cfg, k) for k in _ARCH_FIELDS}
    return InitSource(path, "run", ckpt, fields, _tokenizer_dir(ckpt.parent.parent, state))


def sentence_transformers_module(path: Path) -> Path | None:
    """The folder of a sentence-transformers model's Transformer module (``modules.json``; the
    model folder itself in today's layout, ``0_Transformer/``-style in older ones), or None when
    ``path`` is not such a model."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InitError(f"--init_from {path}: {modules_file} is not valid JSON ({e}).") from None
    for module in modules if isinstance(modules, list) else []:
        if isinstance(module, dict) and str(module.get("type", "")).endswith(".Transformer"):
            return path / str(module.get("path", ""))
    raise InitError(
        f"--init_from {path}: {modules_file} lists no sentence_transformers.models.Transformer "
        "module, so there are no encoder weights to start from."
    )


def locate(path: str | Path) -> InitSource:
    """Identify --init_from PATH (HF folder, sentence-transformers folder or run checkpoint);
    errors say what was expected."""
    path = Path(path)
    if not path.exists():
        raise InitError(f"--init_from {path}: no such file or folder.")
    module = sentence_transformers_module(path) if path.is_dir() else None
    if module is not None and module != path:
        found = locate(module)
        return dataclasses.replace(found, path=path, kind="sentence-transformers")
    if module is not None:
        found = _hf_source(path, json.loads((path / "config.json").read_text(encoding="utf-8")))
        return dataclasses.replace(found, kind="sentence-transformers")
    cfg_file = path / "config.json"
    config = None
    if cfg_file.is_file():
        try:
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise InitError(f"--init_from {path}: {cfg_file} is not valid JSON ({e}).") from None
    if isinstance(config, dict) and "model_type" in config:
        return _hf_source(path, config)
    try:
        ckpt = resolve_resume(str(path), path, flag="--init_from") if path.is_dir() else None
    except CorruptCheckpointError as e:  # files that do not match COMPLETE: never loaded
        raise InitError(str(e)) from None
    except CheckpointError:
        ckpt = None
    if ckpt is not None:
        return _run_source(path, ckpt)
    raise InitError(
        f"--init_from {path}: not a BERT checkpoint: expected a transformers folder "
        '(config.json with model_type "bert" and model.safetensors or '
        "pytorch_model.bin) or a pretrain run / checkpoints/step_N folder with a "
        "COMPLETE marker."
    )


def read_init_config(path: str | Path) -> tuple[dict[str, Any], Path | None]:
    """(ModelConfig architecture fields of the checkpoint, its tokenizer folder or None)."""
    src = locate(path)
    return src.model_fields, src.tokenizer_dir


def architecture_conflicts(ckpt_cfg: dict[str, Any], flags_cfg: dict[str, Any]) -> list[str]:
    """Differences between the checkpoint's architecture and fields the user gave explicitly
    (a preset's fields or flags), as "field: checkpoint X, flags Y" lines; empty when none."""
    return [
        f"{k}: checkpoint {ckpt_cfg[k]!r}, flags {flags_cfg[k]!r}"
        for k in CONFLICT_FIELDS
        if k in flags_cfg and k in ckpt_cfg and flags_cfg[k] != ckpt_cfg[k]
    ]


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    if file.suffix == ".safetensors":
        return load_file(str(file), device="cpu")
    return torch.load(file, map_location="cpu", weights_only=True)


def read_hf_weights(folder: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """All tensors of a transformers folder (single or sharded file) and the file read."""
    for name in _HF_WEIGHTS:
        file = folder / name
        if not file.is_file():
            continue
        if name.endswith(".index.json"):
            shards = sorted(set(json.loads(file.read_text())["weight_map"].values()))
            sd: dict[str, torch.Tensor] = {}
            for shard in shards:
                sd.update(_load_file(folder / shard))
            return sd, file
        return _load_file(file), file
    raise InitError(f"--init_from {folder}: no weights file ({', '.join(_HF_WEIGHTS)}).")


def canonical_keys(sd: dict[str, Any], where: Path) -> dict[str, Any]:
    """Our (transformers BertFor*) names: prefixes model./module. dropped, bare BertModel keys
    under bert., LayerNorm gamma/beta renamed weight/bias."""
    out: dict[str, Any] = {}
    for key, value in sd.items():
        k = key
        while k.startswith(("model.", "module.")):
            k = k.split(".", 1)[1]
        if k.startswith(("embeddings.", "encoder.", "pooler.")):
            k = "bert." + k
        k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
        k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
        if k in out:
            raise InitError(f"--init_from {where}: keys {key!r} and another both map to {k!r}.")
        out[k] = value
    return out


def init_model_config(
    path: str | Path, base_cfg: Any, explicit: dict[str, Any], max_seq_len: int | None = None
) -> Any:
    """The ModelConfig to build for --init_from PATH: `base_cfg` (the preset with the flags) with
    the checkpoint's architecture. `explicit`: the ModelConfig fields the user set on purpose (a
    --model preset's fields and --hidden_size-style flags); disagreeing ones are an InitError
    listing every difference. Dropout and initializer_range given explicitly are kept."""
    fields, _ = read_init_config(path)
    if explicit.get("config_json"):
        raise InitError(
            f"--init_from {path} and --config_json {explicit['config_json']} both "
            "set the architecture; drop --config_json (it comes from the checkpoint)."
        )
    conflicts = architecture_conflicts(fields, explicit)
    if conflicts:
        raise InitError(
            f"--init_from {path}: the checkpoint's architecture differs from the "
            "preset/flags given:\n  " + "\n  ".join(conflicts) + "\nDrop those flags "
            "(the architecture comes from the checkpoint) or choose another checkpoint."
        )
    check_positions(fields["max_position_embeddings"], max_seq_len, Path(path))
    kept = {k: v for k, v in explicit.items() if k in fields and k not in CONFLICT_FIELDS}
    return dataclasses.replace(base_cfg, **{**fields, **kept}, config_json=None, name="init_from")


def check_positions(rows: int, max_seq_len: int | None, path: Path) -> None:
    if max_seq_len is not None and rows < max_seq_len:
        raise InitError(
            f"--init_from {path}: its position embeddings cover {rows} positions, but "
            f"the shards' max_seq_len is {max_seq_len}. BERT has no rows for the "
            f"positions beyond {rows}: rebuild the shards with --max_seq_len {rows} "
            "or less, or start from a checkpoint with more positions."
        )


def init_architecture(cfg: Any, max_seq_len: int | None) -> Any:
    """The ModelConfig of a run started with --init_from (``cfg``: its TrainConfig): the
    checkpoint's architecture at the first launch; on a resume the run's own checkpoint's (it
    took the architecture from the source then, and the source folder may be gone now)."""
    resume = resolve_resume(cfg.run.resume, cfg.run.output_dir)
    if resume is not None:
        return ModelConfig(**read_state(resume)["config"]["model_cfg"])
    return init_model_config(
        cfg.run.init_from, cfg.model_cfg, cfg.explicit_model, max_seq_len=max_seq_len
    )
