"""ModernBERT's attention paths (pretrain.model.attention_paths) against independent oracles: the
blocked local path against SDPA with the dense masked band; a whole model under our attention
function against transformers' own SDPA implementation; the unpadded varlen plumbing (the CUDA
kernel replaced by a pure-PyTorch varlen reference of the same signature) against the padded
path. The real varlen kernel runs on a GPU in ``make gpu-check``."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_bert import VOCAB, masked_batch

from bertforge.pretrain.model import attention_paths
from bertforge.pretrain.model.attention_paths import (
    DocumentLayout,
    blocked_local_attention,
    dense_document_attention,
    global_document_attention,
)
from bertforge.pretrain.model.document_attention import document_index
from bertforge.pretrain.model.registry import PRESETS, build_model

SEP = 3  # masked_batch's separator


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def random_documents(B: int, T: int, seed: int) -> torch.Tensor:
    """[B, T] document ids: a few documents per row, row 1 padded after 60% (-1)."""
    g = torch.Generator().manual_seed(seed)
    docs = torch.cumsum(torch.rand(B, T, generator=g) < 4.0 / T, dim=1)
    if B > 1:
        docs[1, int(0.6 * T) :] = -1
    return docs


def attend_and_grad(fn, q, k, v, docs, seed=1):
    """Output of fn and the gradients of a random projection of it with respect to q, k, v."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v, docs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (out * g).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize(
    "T, window, chunk",
    [(5, 8, None), (37, 2, None), (37, 2, 2), (64, 4, 4), (100, 3, 5), (130, 20, None)],
)
def test_blocked_local_attention_equals_the_dense_masked_band(T, window, chunk):
    B, H, d = 3, 2, 8
    g = torch.Generator().manual_seed(T * 31 + window)
    q, k, v = (torch.randn(B, H, T, d, generator=g) for _ in range(3))
    docs = random_documents(B, T, seed=T)
    got = attend_and_grad(
        lambda *a: blocked_local_attention(*a, window=window, chunk=chunk), q, k, v, docs
    )
    ref = attend_and_grad(lambda *a: dense_document_attention(*a, window=window), q, k, v, docs)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref, strict=True):
        assert rel(a, b) < 1e-5, (name, rel(a, b))


def test_global_layers_shared_additive_mask_equals_the_boolean_document_mask():
    B, H, T, d = 3, 2, 50, 8
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, T, d, generator=g) for _ in range(3))
    docs = random_documents(B, T, seed=7)
    layout = DocumentLayout(docs)
    got = attend_and_grad(lambda *a: global_document_attention(*a[:3], layout), q, k, v, docs)
    ref = attend_and_grad(lambda *a: dense_document_attention(*a), q, k, v, docs)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref, strict=True):
        assert rel(a, b) < 1e-5, (name, rel(a, b))
    assert layout.global_mask(torch.float32) is layout.global_mask(torch.float32)  # built once


def test_blocked_local_attention_refuses_a_chunk_shorter_than_the_window():
    x = torch.zeros(1, 1, 10, 4)
    with pytest.raises(ValueError, match="chunk 2 is shorter than the window 3"):
        blocked_local_attention(x, x, x, torch.zeros(1, 10, dtype=torch.long), 3, chunk=2)


def tiny_model():
    """modernbert-tiny with a window (8 tokens: |q - k| <= 4) much shorter than the batch."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(PRESETS["modernbert-tiny"], loss_impl="torch", local_attention=8)
    return build_model(cfg, VOCAB)


def document_batch(length: int = 40) -> dict:
    """masked_batch with the loader's document_ids and position_ids (two documents a row)."""
    batch = masked_batch(length=length)
    lengths = batch["attention_mask"].sum(1).numpy()
    docs, pos = document_index(batch["input_ids"].numpy(), lengths, SEP)
    return {**batch, "document_ids": torch.from_numpy(docs), "position_ids": torch.from_numpy(pos)}


def loss_and_grads(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch)["loss"]
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_training_signal(got, ref):
    assert rel(got[0], ref[0]) < 1e-5, (got[0], ref[0])
    worst = max(rel(got[1][n], ref[1][n]) for n in ref[1])
    assert worst < 1e-5, worst


# 100 tokens: the local layers take the dense band (<= 8 chunks of 32); 300: the blocked path
@pytest.mark.parametrize("length", [100, 300])
@pytest.mark.parametrize("documents", [True, False], ids=["document", "full"])
def test_whole_model_equals_transformers_sdpa_with_dense_masks(documents, length):
    batch = document_batch(length=length) if documents else masked_batch(length=length)
    ours = tiny_model()
    twin = copy.deepcopy(ours)
    twin.config._attn_implementation = "sdpa"  # transformers' own function, our dense masks
    assert twin.config is not ours.config
    assert_same_training_signal(loss_and_grads(ours, batch), loss_and_grads(twin, batch))


def test_local_layers_take_the_blocked_path_only_past_eight_chunks(monkeypatch):
    """At most DENSE_LOCAL_CHUNKS chunks (tiny_model: 8 x 32 = 256 tokens) a local layer runs
    one SDPA with the dense band; one token more and it runs the blocked path."""
    calls = []
    blocked = attention_paths.blocked_local_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape[2])
        return blocked(*args, **kwargs)

    monkeypatch.setattr(attention_paths, "blocked_local_attention", counted)
    model = tiny_model()
    limit = attention_paths.DENSE_LOCAL_CHUNKS * 32
    for length in (limit, limit + 1):
        model(**document_batch(length=length))
    assert calls and set(calls) == {limit + 1}  # the local layers of the longer batch only


def reference_varlen_attn(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1)
):
    """torch.nn.attention.varlen.varlen_attn's arithmetic in plain PyTorch: each segment of
    cu_seq_q attends within itself (dense SDPA, |q - k| <= window_size where set)."""
    assert cu_seq_q is cu_seq_k and cu_seq_q.dtype == torch.int32
    assert max_q == max_k == int((cu_seq_q[1:] - cu_seq_q[:-1]).max())
    out = []
    for a, b in zip(cu_seq_q[:-1].tolist(), cu_seq_q[1:].tolist(), strict=True):
        q, k, v = (x[a:b].transpose(0, 1) for x in (query, key, value))  # [H, n, d]
        mask = None
        if window_size != (-1, -1):
            left, right = window_size
            diff = torch.arange(b - a)[:, None] - torch.arange(b - a)[None, :]
            mask = (diff <= left) & (-diff <= right)
        out.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale))
    return torch.cat(out, dim=1).transpose(0, 1)


@pytest.mark.parametrize("documents", [True, False], ids=["document", "full"])
def test_unpadded_varlen_path_equals_the_padded_path(monkeypatch, documents):
    calls = []

    def counting_reference(*args, **kwargs):
        calls.append(kwargs["window_size"])
        return reference_varlen_attn(*args, **kwargs)

    monkeypatch.setattr(attention_paths, "varlen_attn", counting_reference)
    batch = document_batch(length=60) if documents else masked_batch(length=60)
    padded = tiny_model()
    unpadded = copy.deepcopy(padded)
    padded.attention_path, unpadded.attention_path = "padded", "varlen"
    assert_same_training_signal(loss_and_grads(unpadded, batch), loss_and_grads(padded, batch))
    # One call per layer: (-1, -1) for the global layer, the half-window for the local ones.
    assert calls == [(-1, -1), (4, 4), (4, 4)]


def test_unpadded_layout_has_one_segment_per_document():
    layout = DocumentLayout.unpadded(torch.tensor([[0, 0, 0, 1, 2, 2, 5, 5, 5, 5]]))
    assert layout.cu_seqlens.tolist() == [0, 3, 4, 6, 10] and layout.max_seqlen == 4
    assert layout.cu_seqlens.dtype == torch.int32


def test_the_path_is_chosen_by_device_dtype_and_dropout():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert attention_paths.use_varlen(cuda, torch.bfloat16, 0.0)[0]
    assert not attention_paths.use_varlen(cpu, torch.bfloat16, 0.0)[0]
    assert not attention_paths.use_varlen(cuda, torch.float32, 0.0)[0]
    assert not attention_paths.use_varlen(cuda, torch.bfloat16, 0.1)[0]


def test_rtd_discriminator_on_the_unpadded_path_equals_the_padded_path(monkeypatch):
    """--objective rtd: the discriminator's logit of each real token, and the generator's
    masked rows, are the same through the unpadded varlen path as through the padded one."""
    from bertforge.pretrain.model.objective_config import ObjectiveConfig
    from bertforge.pretrain.model.specs import resolve_objective

    monkeypatch.setattr(attention_paths, "varlen_attn", reference_varlen_attn)
    cfg = dataclasses.replace(PRESETS["modernbert-tiny"], local_attention=8)
    rtd = resolve_objective(ObjectiveConfig(objective="rtd"), "packed")
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB, objective=rtd).eval()
    batch = document_batch(length=60)
    where = {k: batch[k] for k in ("document_ids", "position_ids")}
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    with torch.no_grad():
        padded = model.discriminator.real_logits(ids, mask, **where)
        rows = model.predict_masked(ids, mask, None, labels, **where)
        model.discriminator.attention_path = model.generator.attention_path = "varlen"
        unpadded = model.discriminator.real_logits(ids, mask, **where)
        unpadded_rows = model.predict_masked(ids, mask, None, labels, **where)
    torch.testing.assert_close(unpadded, padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(unpadded_rows, rows, atol=1e-5, rtol=1e-5)
