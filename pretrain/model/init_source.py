"""Where `--init_from PATH` points and what it holds: a Hugging Face BERT or ModernBERT folder or
one of our runs, its architecture (checked against the flags) and its tensors under our names.

PATH is a transformers folder (`BertForMaskedLM`, `BertForPreTraining` or a bare `BertModel`,
also as a sentence-transformers model publishes it: `modules.json`, `1_Pooling/`, the encoder's
folder at the top or in a module folder;
`model.safetensors`, `pytorch_model.bin` or their sharded `*.index.json` forms; keys with or
without the `bert.`, `model.` or `module.` prefixes, `LayerNorm.gamma/beta` as old TF-converted
files spell them), a transformers ModernBERT folder (`ModernBertForMaskedLM` or a bare
`ModernBertModel`; legacy `global_rope_theta` keys or `rope_parameters`) or a pretrain run of
either arch: its folder, its `checkpoints/` folder or one `step_N` folder.

- `locate` identifies the source (errors say what was expected);
- the architecture comes from the checkpoint (`read_init_config`, `init_model_config`,
  `init_architecture`); fields the user gave explicitly that disagree are listed by
  `architecture_conflicts`;
- `read_hf_weights` and `canonical_keys` read a transformers folder's tensors;
- a source of the other arch than the run's is refused (`check_arch`). ModernBERT has no position
  table (rotary), so its run may take longer sequences than the checkpoint's
  `max_position_embeddings` (`extend_context`: a context extension, reported).

Loading them into the model, with the vocabulary plan, is :mod:`pretrain.model.init_from`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from bertforge.pretrain.model.bert.arch import resolve_config
from bertforge.pretrain.model.errors import InitError
from bertforge.pretrain.model.model_config import ModelConfig
from bertforge.pretrain.model.registry import (
    ARCHES,
    DEFAULT_PRESET,
    PRESETS,
    resolve_attention,
    spec_for_model_type,
)
from bertforge.pretrain.model.specs import StateDictAdapter
from bertforge.pretrain.run_folder.run_checkpoints import (
    CheckpointError,
    CorruptCheckpointError,
    read_state,
    resolve_resume,
    run_tokenizer_dir,
)

_HF_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass
class InitSource:
    """Where the initial weights come from and what they are."""

    path: Path  # as given to --init_from
    kind: str  # "hf" (transformers folder), "sentence-transformers" or "run" (our checkpoint)
    checkpoint: Path  # the HF folder, or the run's step_N folder
    model_fields: dict[str, Any]  # "arch" and its ModelConfig architecture fields
    tokenizer_dir: Path | None  # the checkpoint's tokenizer, when it has one


def _find_tokenizer(folder: Path) -> Path | None:
    has = any((folder / f).is_file() for f in ("tokenizer.json", "vocab.txt"))
    return folder if has else None


def _hf_source(path: Path, config: dict[str, Any]) -> InitSource:
    model_type = config.get("model_type")
    spec = spec_for_model_type(model_type)
    if spec is None:
        known = " and ".join(
            f"{s.display_name} (model_type {', '.join(map(repr, s.adapter.model_types))})"
            for s in ARCHES.values()
        )
        raise InitError(
            f"--init_from {path}: {path / 'config.json'} has model_type {model_type!r}; only "
            f"{known} checkpoints can initialise this model."
        )
    fields = spec.adapter.fields_from_hf(path, config)
    if not any((path / f).is_file() for f in _HF_WEIGHTS):
        raise InitError(
            f"--init_from {path}: no weights there (expected one of "
            f"{', '.join(_HF_WEIGHTS)}; TensorFlow/Flax files must be converted with "
            "transformers first)."
        )
    return InitSource(path, "hf", path, fields, _find_tokenizer(path))


def _run_source(path: Path, ckpt: Path) -> InitSource:
    state = read_state(ckpt)
    vocab = int(state["vocab_size"])
    try:
        cfg = resolve_config(ModelConfig(**state["config"]["model_cfg"]), vocab)
    except ValueError as e:
        raise InitError(f"--init_from {path}: the architecture of {ckpt}: {e}") from e
    names = ARCHES[cfg.arch].adapter.run_fields
    fields = {"arch": cfg.arch, **{k: getattr(cfg, k) for k in names}}
    return InitSource(path, "run", ckpt, fields, run_tokenizer_dir(ckpt.parent.parent, state))


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
    names = [s.display_name for s in ARCHES.values()]
    types = " or ".join(repr(t) for s in ARCHES.values() for t in s.adapter.model_types)
    raise InitError(
        f"--init_from {path}: not a {names[0]} checkpoint (nor a {', '.join(names[1:])} one): "
        f"expected a transformers folder (config.json with model_type {types} and "
        "model.safetensors or pytorch_model.bin) or a pretrain run / checkpoints/step_N "
        "folder with a COMPLETE marker."
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
        for k in ARCHES[ckpt_cfg.get("arch", "bert")].adapter.conflict_fields
        if k in flags_cfg and k in ckpt_cfg and flags_cfg[k] != ckpt_cfg[k]
    ]


def check_arch(src: InitSource, run_arch: str) -> None:
    """A source of another arch than the one the launch asks for (--arch, or a --model preset's)
    cannot initialise it (other names, shapes and computation); the message names both archs."""
    arch = src.model_fields["arch"]
    if arch == run_arch:
        return
    what = (
        f"{src.checkpoint} is a --arch {arch} run"
        if src.kind == "run"
        else f"{src.checkpoint} is a {ARCHES[arch].display_name} checkpoint (--arch {arch})"
    )
    raise InitError(
        f"--init_from {src.path}: {what}, but this run is --arch {run_arch}. Drop --arch and a "
        f"--model of another arch (the architecture comes from the checkpoint), or start from a "
        f"{ARCHES[run_arch].display_name} checkpoint."
    )


def adapter_of(arch: str) -> StateDictAdapter:
    """The Hugging Face adapter of ``arch`` (its spec's)."""
    return ARCHES[arch].adapter


def extend_context(cfg: Any, max_seq_len: int | None) -> Any:
    """A rotary arch (ModernBERT) has no position table: a run on longer sequences than its
    max_position_embeddings raises it to them (a context extension; the --init_from report says
    so). A learned table's config is returned as it is (it cannot grow: :func:`check_positions`)."""
    if (
        not ARCHES[cfg.arch].rotary
        or max_seq_len is None
        or max_seq_len <= cfg.max_position_embeddings
    ):
        return cfg
    return dataclasses.replace(cfg, max_position_embeddings=max_seq_len)


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


def canonical_keys(sd: dict[str, Any], where: Path, arch: str = "bert") -> dict[str, Any]:
    """The tensors of ``sd`` under our model's names for ``arch`` (its adapter's ``to_ours``:
    transformers' BertFor* / ModernBertForMaskedLM names); two keys mapping to one name are an
    InitError."""
    rename = adapter_of(arch).to_ours
    out: dict[str, Any] = {}
    for key, value in sd.items():
        k = rename(key)
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
    listing every difference. Dropout and initializer_range given explicitly are kept, and for
    ModernBERT max_position_embeddings and the rope thetas (a context extension raises them);
    its max_position_embeddings grows to ``max_seq_len`` (:func:`extend_context`).
    The arch is the checkpoint's: without "arch" in ``explicit`` (no --arch, no --model) the
    build starts from that arch's default preset with the explicit fields; an explicit other
    arch is an InitError naming both (:func:`check_arch`)."""
    src = locate(path)
    fields = src.model_fields
    if "arch" in explicit:
        check_arch(src, explicit["arch"])
    base_cfg = _on_arch(base_cfg, fields["arch"], explicit)
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
    adapter = adapter_of(fields["arch"])
    if adapter.pos_emb is not None:  # a learned position table cannot grow
        check_positions(fields["max_position_embeddings"], max_seq_len, Path(path))
    fixed = adapter.conflict_fields
    kept = {k: v for k, v in explicit.items() if k in fields and k not in fixed}
    cfg = dataclasses.replace(base_cfg, **{**fields, **kept}, config_json=None, name="init_from")
    return extend_context(cfg, max_seq_len)


def _on_arch(base_cfg: Any, arch: str, explicit: dict[str, Any]) -> Any:
    """``base_cfg``, or when the checkpoint's ``arch`` is another one, that arch's default preset
    with the fields the user gave explicitly (an ``--attention auto`` resolved for it, as the
    command line resolves it for the flags' arch)."""
    if base_cfg.arch == arch:
        return base_cfg

    given = {k: v for k, v in explicit.items() if k != "name"}
    cfg = dataclasses.replace(PRESETS[DEFAULT_PRESET[arch]], **given)
    return dataclasses.replace(cfg, attention=resolve_attention(cfg.attention, arch))


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
