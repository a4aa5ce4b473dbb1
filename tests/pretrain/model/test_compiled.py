"""``--compile`` (pretrain.model.compiled): the compiled encoders compute what the eager ones do.

The oracle is the same model run eagerly: a deep copy with the same weights, the same batch
(document attention on ModernBERT: the blocked local path and the shared document mask run inside
the compiled graph). Stated tolerance: 1e-5 relative to the largest value, in float32, for the
loss, the masked rows' logits and every gradient (inductor reorders and fuses float32 arithmetic,
so bit equality is not expected; measured differences are about 1e-7). Compilation costs tens of
seconds per model on one CPU core, so each architecture compiles once.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from test_bert import VOCAB, masked_batch
from torch._dynamo.utils import counters

from bertforge.pretrain.model.compiled import check_compile, compile_encoders
from bertforge.pretrain.model.errors import ArchError
from bertforge.pretrain.model.objective_config import ObjectiveConfig
from bertforge.pretrain.model.registry import PRESETS, build_model
from bertforge.pretrain.model.specs import resolve_objective

TOL = 1e-5
SEP = 3  # masked_batch's separator


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def step(model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch)["loss"]
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def compiled_pair(preset: str, objective: str = "mlm", **overrides):
    torch.manual_seed(0)
    cfg = dataclasses.replace(
        PRESETS[preset], loss_impl="torch", hidden_dropout_prob=0.0, **overrides
    )
    spec = resolve_objective(ObjectiveConfig(objective=objective), "packed")
    eager = build_model(cfg, VOCAB, objective=spec).train()
    compiled = copy.deepcopy(eager)
    assert compile_encoders(compiled) == len(eager.encoders())
    return eager, compiled


def document_batch() -> dict:
    """masked_batch with document ids: each [SEP] closes a document, padding -1."""
    batch = masked_batch(n=4, length=64, seed=3)
    ids, real = batch["input_ids"], batch["attention_mask"].bool()
    closes = torch.cumsum((ids == SEP).long(), dim=1) - (ids == SEP).long()
    batch["document_ids"] = torch.where(real, closes, -1)
    del batch["attention_mask"]
    return batch


def assert_same_step(eager, compiled, batch: dict) -> None:
    loss_e, grads_e = step(eager, batch)
    graphs = counters["stats"]["unique_graphs"]
    loss_c, grads_c = step(compiled, batch)
    assert counters["stats"]["unique_graphs"] > graphs  # dynamo compiled it: not the eager path
    assert rel(loss_c, loss_e) < TOL
    assert grads_c.keys() == grads_e.keys()
    # A gradient that is zero in exact arithmetic (BERT's key bias: softmax ignores it) is
    # rounding noise on both sides: each is measured against 1e-4 of the model's largest.
    floor = 1e-4 * max(float(g.abs().max()) for g in grads_e.values())
    for name, g in grads_e.items():
        scale = max(float(g.abs().max()), floor)
        assert float((grads_c[name] - g).abs().max()) / scale < TOL, name
    # names and state dicts are the eager model's: checkpoints and exports do not change
    assert compiled.state_dict().keys() == eager.state_dict().keys()


def test_compiled_modernbert_with_document_attention_equals_eager():
    eager, compiled = compiled_pair("modernbert-tiny", attention_probs_dropout_prob=0.0)
    assert_same_step(eager, compiled, document_batch())


def test_compiled_bert_equals_eager():
    eager, compiled = compiled_pair("tiny", attention_probs_dropout_prob=0.0)
    assert_same_step(eager, compiled, masked_batch(n=4, length=48, seed=5))


def test_compile_is_refused_under_zero3_naming_the_flag():
    check_compile(True, 2)
    check_compile(False, 3)
    with pytest.raises(ArchError, match="--compile with ZeRO-3"):
        check_compile(True, 3)
