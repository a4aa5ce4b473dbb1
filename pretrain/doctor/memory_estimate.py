"""Memory per rank for a model preset and a DeepSpeed config, before anything is launched.

Model states follow the ZeRO paper (Rajbhandari et al. 2020) for Adam with Ψ parameters on N ranks:
mixed precision keeps 2Ψ half weights + 2Ψ half gradients + 12Ψ optimizer state (fp32 master, m, v);
stage 1 partitions the optimizer state, stage 2 also the gradients, stage 3 also the weights.
fp32 training keeps 4Ψ + 4Ψ + 8Ψ (m, v), plus a 4Ψ fp32 partition copy once ZeRO is on.
Activations follow Korthikanti et al. 2022 (bytes per layer s·b·h·(34 + 5·a·s/h) in 16 bit), an
upper bound since fused attention does not keep the s×s scores; with activation checkpointing only
each layer's input (2·s·b·h) is kept, plus one layer being recomputed.

Each arch's spec gives its layers' bytes (``ModelSpec.layer_activation_bytes``) and the shape
terms they need (``ModelSpec.memory_terms``). ModernBERT (no dropout, GeGLU of width i, pre-norm)
keeps per layer, in 16 bit:
s·b·(16h + 8i) (the two norms' inputs 4h, Wqkv's input 2h, rotated q and k 4h, v 2h, Wo's input
2h; GeGLU: Wi's input 2h, its 2i-wide output 4i, the activated half 2i, Wo's input 2i) plus the
attention scores of the path that runs (:mod:`pretrain.model.attention_paths`): none on a GPU in
half precision (unpadded flash-attention varlen keeps 4 bytes of log-sum-exp per head and
token); otherwise the softmax probabilities, 2·a·b·s·k, with k = s keys in a global layer and
k = the blocked path's 3 chunks in a local one (an upper bound for the global layers, as above:
fused SDPA kernels do not keep them; the blocked path's SDPA does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bertforge.data_prep.layout import MANIFEST
from bertforge.data_prep.object_store import Retry, Store, StoreError, is_url
from bertforge.data_prep.reader import ShardError, load_manifest
from bertforge.pretrain.model.bert import padded_vocab
from bertforge.pretrain.model.registry import build_model, get_spec
from bertforge.pretrain.model.registry import preset as preset_config
from bertforge.pretrain.model.specs import ObjectiveSpec, resolve_objective
from bertforge.pretrain.objectives.registry import objective_for

if TYPE_CHECKING:
    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.objective_config import ObjectiveConfig

GIB = 1 << 30
RUNTIME_BYTES = 1 * GIB  # CUDA context / allocator slack, or the Python+torch process on a CPU
DEFAULT_BUCKET = 500_000_000  # DeepSpeed's default reduce_bucket_size (elements)
MLM_FRACTION = 0.15  # masked share of tokens: the head's logits are only built for these


def gib(n: float | None) -> str:
    """Bytes as a short GiB (or MiB, below 0.1 GiB) string."""
    if n is None:
        return "?"
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about the model and the sequences."""

    name: str  # preset name
    params: int  # number of distinct parameters (exact, from the model built on the meta device;
    # weights shared between layers counted once)
    hidden: int  # hidden size h
    layers: int  # encoder layers L
    heads: int  # attention heads a
    seq_len: int  # tokens per sequence s
    vocab: int  # padded vocabulary (rows of the MLM decoder)
    checkpointing: bool  # activation checkpointing on
    arch: str = "bert"  # --arch (pretrain.model.registry)
    # the spec's memory_terms: ModernBERT's GeGLU width i (BERT's formula assumes 4h), layers
    # attending to the whole sequence, keys a local layer's query chunk sees (blocked path)
    intermediate: int = 0
    global_layers: int = 0
    local_keys: int = 0
    #: a network the objective trains beside the encoder (replaced-token detection's
    #: generator): its shape (its weights are in ``params``; its layers keep
    #: activations of their own, and its head the masked rows' logits)
    generator: ModelShape | None = None


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank by kind, and what one checkpoint writes."""

    params: int  # weights held by this rank
    grads: int  # gradients held by this rank
    optimizer: int  # optimizer state (incl. fp32 master) held by this rank
    buffers: int  # ZeRO communication buckets
    activations: int  # activations of one micro-batch
    runtime: int  # process / CUDA context overhead
    checkpoint_bytes: int  # optimizer state of a checkpoint, all ranks together
    model_file_bytes: int  # model-state file of a checkpoint

    @property
    def total(self) -> int:
        """Peak bytes per rank."""
        return (
            self.params
            + self.grads
            + self.optimizer
            + self.buffers
            + self.activations
            + self.runtime
        )

    def describe(self) -> str:
        """Short breakdown for the report."""
        return (
            f"weights {gib(self.params)}, grads {gib(self.grads)}, optimizer "
            f"{gib(self.optimizer)}, buckets {gib(self.buffers)}, activations "
            f"{gib(self.activations)}, runtime {gib(self.runtime)}"
        )


def count_params(
    model: str | ModelConfig, vocab_size: int, nsp: bool, objective: ObjectiveSpec | None = None
) -> tuple[int, Any]:
    """(parameter count, (ModelConfig, padded vocabulary)) of the trainer's model for a preset name
    or a full ModelConfig (flag overrides such as --num_hidden_layers and --share_layers
    included) and ``objective`` (an RTD generator's weights included), built on the meta device
    (no memory used)."""
    cfg = preset_config(model) if isinstance(model, str) else model
    with torch.device("meta"):
        built = build_model(cfg, vocab_size, nsp and objective is None, objective=objective)
    # parameters() yields each Parameter object once: the tied decoder weight and the weights of
    # layers that share them (--share_layers) are counted once, as DeepSpeed partitions them once.
    n = sum(p.numel() for p in built.parameters())
    return n, (cfg, padded_vocab(vocab_size, cfg.vocab_multiple))


def model_shape(
    model: str | ModelConfig,
    data: Path,
    seq_len: int | None,
    checkpointing: bool,
    objective: ObjectiveConfig | None = None,
) -> ModelShape:
    """Shape of `model` (a preset name or the run's ModelConfig) for the shards in `data`
    (vocabulary, format, max_seq_len from the manifest; BERT's 30522 / nsp off / 128 when the
    folder is not on this node) and `objective` (--objective; an RTD generator's shape in
    ``generator``). Shared layers hold their weights once but still each compute (and keep
    activations) per layer, so `layers` stays num_hidden_layers."""
    vocab, nsp, max_len = 30522, False, 128
    m = None
    if is_url(data):  # object storage: its manifest (the data check reports a failure)
        try:
            m = json.loads(Store(str(data), Retry(tries=2)).read_bytes(MANIFEST))
        except (StoreError, ValueError):
            m = None
    elif (Path(data) / MANIFEST).is_file():
        try:
            m = load_manifest(Path(data))
        except ShardError:  # the data check reports the folder; estimate with the defaults
            m = None
    if m is not None:
        vocab, nsp = m["tokenizer"]["vocab_size"], m["format"] == "nsp"
        max_len = m["max_seq_len"]

    spec = resolve_objective(objective, "nsp" if nsp else "packed")
    n, (cfg, padded) = count_params(model, vocab, nsp, spec)
    gen = objective_for(spec).generator_config(cfg, spec.settings)  # a network beside it
    return ModelShape(
        cfg.name,
        n,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        seq_len or max_len,
        padded,
        checkpointing,
        arch=cfg.arch,
        **get_spec(cfg.arch).memory_terms(cfg),
        generator=_generator_shape(gen, seq_len or max_len, padded, checkpointing),
    )


def _generator_shape(cfg: ModelConfig | None, seq_len: int, vocab: int, checkpointing: bool):
    """The RTD generator's shape (its parameters are counted with the discriminator's)."""
    if cfg is None:
        return None
    return ModelShape(
        cfg.name,
        0,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        seq_len,
        vocab,
        checkpointing,
        arch=cfg.arch,
        **get_spec(cfg.arch).memory_terms(cfg),
    )


def estimate_memory(
    shape: ModelShape, ds_config: dict, world: int, micro_batch: int, on_gpu: bool = True
) -> MemoryEstimate:
    """Bytes per rank for training `shape` with `ds_config` on `world` data-parallel ranks."""
    zero = ds_config.get("zero_optimization", {}) or {}
    stage = int(zero.get("stage", 0))
    half = any((ds_config.get(k) or {}).get("enabled") for k in ("fp16", "bf16"))
    p = shape.params
    w_bytes = 2 if half else 4
    opt_bytes = 12 if (half or stage >= 1) else 8
    params = w_bytes * p // (world if stage >= 3 else 1)
    grads = w_bytes * p // (world if stage >= 2 else 1)
    optimizer = opt_bytes * p // (world if stage >= 1 else 1)
    if on_gpu and ((zero.get("offload_optimizer") or {}).get("device") or "none") != "none":
        optimizer = 0  # lives in host memory
    if (
        on_gpu
        and stage >= 3
        and ((zero.get("offload_param") or {}).get("device") or "none") != "none"
    ):
        params = 0
    buffers = 0
    if stage in (1, 2):
        buffers = int(zero.get("reduce_bucket_size", DEFAULT_BUCKET)) * w_bytes
        buffers = min(buffers, grads)  # a bucket never exceeds the gradients it holds

    act_scale = 1 if half else 2  # the formulas count 16-bit activations
    activations = encoder_activations(shape, micro_batch, on_gpu and half, act_scale)
    if shape.generator is not None:  # RTD: the generator's layers and head, the sampling's logits
        activations += encoder_activations(shape.generator, micro_batch, on_gpu and half, act_scale)
        activations += MLM_FRACTION * shape.seq_len * micro_batch * shape.vocab * 4
    return MemoryEstimate(
        params,
        grads,
        optimizer,
        buffers,
        int(activations),
        RUNTIME_BYTES,
        checkpoint_bytes=12 * p,
        model_file_bytes=w_bytes * p,
    )


def encoder_activations(shape: ModelShape, micro_batch: int, varlen: bool, scale: int) -> float:
    """Activation bytes of one micro-batch through the encoder's layers (the arch's 16-bit
    formula times ``scale``; with checkpointing each layer's input and the largest layer being
    recomputed) plus the MLM head's fp32 logits and their gradient on the masked rows."""
    s, b, h, L = shape.seq_len, micro_batch, shape.hidden, shape.layers
    # an unpadded varlen path (ModernBERT's) runs on a GPU in half precision
    per_layer = [n * scale for n in get_spec(shape.arch).layer_activation_bytes(shape, b, varlen)]
    if shape.checkpointing:  # each layer's input, and the largest layer being recomputed
        layers = L * 2 * s * b * h * scale + max(per_layer)
    else:
        layers = sum(per_layer)
    return layers + MLM_FRACTION * s * b * shape.vocab * 4 * 2  # fp32 logits and their gradient
