"""What ``--arch`` and the architecture flags set: the encoder's fields.

One dataclass for every architecture (``arch`` "bert" or "modernbert"): the fields a ModernBERT
does not use (``type_vocab_size``, ``share_layers``) stay at their defaults there, and the
ModernBERT-only ones (rotary thetas, local attention) are ignored by BERT. Each arch's presets
(``--model``) live in its folder's ``spec.py``; :mod:`pretrain.model.registry` lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertforge.cli import opt


@dataclass
class ModelConfig:
    """Architecture of the encoder (a preset, optionally overridden, or a BERT config JSON)."""

    name: str = opt("custom", "preset name this config came from (informational)")
    arch: str = opt(
        "bert",
        "encoder architecture: bert (2018 BERT) | modernbert (transformers' ModernBERT block: "
        "rotary positions, GeGLU, pre-norm, no biases, local/global attention); without --model "
        "it picks its tiny preset",
    )
    hidden_size: int = opt(128, "width of the encoder")
    num_hidden_layers: int = opt(2, "number of transformer layers")
    num_attention_heads: int = opt(2, "attention heads per layer (must divide hidden_size)")
    intermediate_size: int = opt(512, "width of the feed-forward layer")
    max_position_embeddings: int = opt(512, "longest sequence the position embeddings cover")
    type_vocab_size: int = opt(2, "token-type (segment) vocabulary")
    hidden_act: str = opt("gelu", "activation of the feed-forward layer and the MLM transform")
    hidden_dropout_prob: float = opt(0.1, "dropout on embeddings and layer outputs")
    attention_probs_dropout_prob: float = opt(0.1, "dropout on attention probabilities")
    layer_norm_eps: float = opt(1e-12, "LayerNorm epsilon")
    initializer_range: float = opt(0.02, "std of the normal initialisation")
    vocab_multiple: int = opt(8, "pad the vocabulary (embedding/decoder rows) to this multiple")
    config_json: str | None = opt(
        None, "BERT config.json whose architecture replaces the fields above"
    )
    loss_impl: str = opt("auto", "kernels.masked_lm_loss implementation: auto | triton | torch")
    share_layers: str = opt(
        "none",
        "cross-layer weight sharing (ALBERT): none | all (one set of layer weights for every "
        "layer) | groups:G (G groups of consecutive layers, one set each)",
    )
    attention: str = opt(
        "auto",
        "document: in packed shards a token attends only within its own document (each [SEP] "
        "closes one) and positions restart per document | full: across the whole sequence | "
        "auto: document for modernbert, full for bert (pretrain.model.document_attention)",
    )
    local_attention: int = opt(
        128, "modernbert: tokens a sliding-window (local) attention layer sees, itself included"
    )
    global_attn_every_n_layers: int = opt(
        3, "modernbert: layers 0, N, 2N, ... attend globally, the others through the window"
    )
    global_rope_theta: float = opt(160000.0, "modernbert: rotary base of the global layers")
    local_rope_theta: float = opt(10000.0, "modernbert: rotary base of the local layers")


def export_config(config, architecture: str, vocab_size: int | None = None):
    """A copy of a transformers ``config`` for export, ``architectures`` set to
    ``[architecture]``, and with ``vocab_size`` (the tokenizer's, no padding rows) when given."""
    conf = type(config).from_dict(config.to_dict())
    conf.architectures = [architecture]
    if vocab_size is not None:
        conf.vocab_size = vocab_size
    return conf


def padded_vocab(vocab_size: int, multiple: int) -> int:
    """Smallest multiple of `multiple` >= vocab_size."""
    return -(-vocab_size // multiple) * multiple
