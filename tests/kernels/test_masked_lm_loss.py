"""kernels.masked_lm_loss: both impls against an independent float64 oracle, and against each other.

Every test runs on conftest's `device`: CUDA tensors and the compiled kernel on a GPU node, CPU
tensors under TRITON_INTERPRET=1 elsewhere. A few GPU-only tests add what the interpreter cannot
show (peak memory, impl="auto" picking the kernel).
The oracle computes logits at EVERY position in float64 and masks the per-token loss, so it shares
no code path (no row gather, no padded-column slicing) with the implementations under test.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.commands import run_cli

from bertforge.kernels import api as kernels
from bertforge.kernels.api import _resolve_impl
from bertforge.kernels.constants import IGNORE_INDEX

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

IMPLS = ("torch", "triton")
# Max |error| / max |reference| allowed against the float64 oracle, per input dtype.
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float64: 1e-5}


def make_case(
    n_pos: int,
    n_masked: int,
    V: int,
    H: int = 16,
    dtype=torch.float32,
    pad: int = 0,
    seed: int = 0,
    device: torch.device | str = "cpu",
):
    """hidden [n_pos, H], weight [V+pad, H], bias [V+pad]; n_masked labels, incl. 0 and V-1."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n_pos, H, generator=g).to(dtype)
    weight = (torch.randn(V + pad, H, generator=g) / H**0.5).to(dtype)
    bias = (torch.randn(V + pad, generator=g) * 0.1).to(dtype)
    labels = torch.full((n_pos,), IGNORE_INDEX, dtype=torch.long)
    where = torch.randperm(n_pos, generator=g)[:n_masked]
    labels[where] = torch.randint(0, V, (n_masked,), generator=g)
    labels[where[:1]] = 0
    labels[where[1:2]] = V - 1
    return tuple(t.to(device) for t in (hidden, weight, bias, labels))


def oracle(hidden, weight, bias, labels, V, normalizer=None, ignore_index=IGNORE_INDEX):
    """float64 loss, grads (hidden, weight, bias) and correct count from the rounded inputs."""
    h, w, b = (t.detach().cpu().double().requires_grad_() for t in (hidden, weight, bias))
    labels = labels.cpu()
    logits = h.reshape(-1, h.shape[-1]) @ w.T + b  # all positions, all columns
    y = labels.reshape(-1)
    valid = y != ignore_index
    safe_y = torch.where(valid, y, 0)
    true_logits = logits[:, :V]
    per_tok = torch.logsumexp(true_logits, dim=-1) - true_logits.gather(1, safe_y[:, None])[:, 0]
    denom = float(normalizer) if normalizer is not None else max(int(valid.sum()), 1)
    loss = (per_tok * valid).sum() / denom
    gh, gw, gb = torch.autograd.grad(loss, (h, w, b))
    correct = int(((true_logits.argmax(-1) == y) & valid).sum())
    return loss.detach(), gh, gw, gb, correct


def run(impl, hidden, weight, bias, labels, scale=1.0, **kw):
    h, w, b = (t.detach().clone().requires_grad_() for t in (hidden, weight, bias))
    out = kernels.masked_lm_loss(h, w, b, labels, impl=impl, **kw)
    (out.loss * scale).backward()
    return out, h.grad, w.grad, b.grad


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.detach().cpu().double(), ref.detach().cpu()
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [8, 4097, 21128, 30522])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_loss_and_grads_match_float64(dtype, V, rows, device):
    hidden, weight, bias, labels = make_case(rows + 5, rows, V, dtype=dtype, device=device)
    ref = oracle(hidden, weight, bias, labels, V)
    results = {impl: run(impl, hidden, weight, bias, labels) for impl in IMPLS}
    for impl, (out, gh, gw, gb) in results.items():
        assert out.loss.dtype == torch.float32 and out.loss.shape == ()
        assert int(out.num_masked) == rows and out.num_masked.dtype == torch.int64
        assert rel_err(out.loss, ref[0]) < TOL[dtype], impl
        for got, want in zip((gh, gw, gb), ref[1:4]):
            assert got.dtype == dtype and torch.isfinite(got).all()
            assert rel_err(got, want) < TOL[dtype], impl
        if dtype == torch.float32:  # low precision may flip near-ties of the argmax
            assert int(out.num_correct) == ref[4]
    # The two impls agree with each other (same rounding of the inputs, same fp32 loss math).
    (o1, *g1), (o2, *g2) = results["torch"], results["triton"]
    assert rel_err(o2.loss, o1.loss.double()) < TOL[dtype]
    for a, b in zip(g1, g2):
        assert rel_err(b, a.double()) < TOL[dtype]


@pytest.mark.parametrize("impl", IMPLS)
def test_all_rows_ignored_gives_zero_loss_and_zero_grads(impl, device):
    hidden, weight, bias, labels = make_case(6, 0, 50, device=device)
    for normalizer in (None, 12):
        out, gh, gw, gb = run(impl, hidden, weight, bias, labels, normalizer=normalizer)
        assert float(out.loss.detach()) == 0.0
        assert int(out.num_masked) == 0 and int(out.num_correct) == 0
        for g in (gh, gw, gb):
            assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("impl", IMPLS)
def test_one_valid_row(impl, device):
    hidden, weight, bias, labels = make_case(9, 1, 4097, device=device)
    ref = oracle(hidden, weight, bias, labels, 4097)
    out, gh, gw, gb = run(impl, hidden, weight, bias, labels)
    assert int(out.num_masked) == 1
    assert rel_err(out.loss, ref[0]) < 1e-5
    assert rel_err(gh, ref[1]) < 1e-5 and rel_err(gw, ref[2]) < 1e-5 and rel_err(gb, ref[3]) < 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_rows_entry_point_matches_float64_with_ignored_rows(impl, device):
    """masked_lm_loss_rows on rows the caller gathered (some still IGNORE_INDEX, as a model that
    keeps a few padding rows would pass them) equals the float64 oracle: ignored rows count for
    nothing, padded vocab included, normalizer honoured."""
    V, pad = 4097, 7
    hidden, weight, bias, labels = make_case(40, 12, V, pad=pad, seed=3, device=device)
    keep = torch.arange(40) % 3 != 0  # a gather that also keeps some ignored rows
    rows_h, rows_y = hidden[keep], labels[keep]
    assert (rows_y == IGNORE_INDEX).any() and (rows_y != IGNORE_INDEX).any()
    n_valid = int((rows_y != IGNORE_INDEX).sum())
    ref = oracle(rows_h, weight, bias, rows_y, V, normalizer=2 * n_valid)
    h, w, b = (t.detach().clone().requires_grad_() for t in (rows_h, weight, bias))
    out = kernels.masked_lm_loss_rows(
        h, w, b, rows_y, vocab_size=V, normalizer=2 * n_valid, impl=impl
    )
    out.loss.backward()
    assert int(out.num_masked) == n_valid and int(out.num_correct) == ref[4]
    assert rel_err(out.loss, ref[0]) < 1e-5
    assert rel_err(h.grad, ref[1]) < 1e-5 and rel_err(w.grad, ref[2]) < 1e-5
    assert rel_err(b.grad, ref[3]) < 1e-5
    with pytest.raises(ValueError, match="hidden_rows must be"):
        kernels.masked_lm_loss_rows(rows_h[None], weight, bias, rows_y[None], impl=impl)


def test_evaluation_under_no_grad(device):
    hidden, weight, bias, labels = make_case(30, 12, 2000, device=device)
    with torch.no_grad():
        outs = [kernels.masked_lm_loss(hidden, weight, bias, labels, impl=i) for i in IMPLS]
    assert not outs[1].loss.requires_grad
    assert torch.allclose(outs[0].loss, outs[1].loss, rtol=1e-6)
    assert int(outs[0].num_correct) == int(outs[1].num_correct)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("normalizer", [37, 37.5, "tensor"])
def test_normalizer_divides_the_summed_loss(impl, normalizer, device):
    hidden, weight, bias, labels = make_case(20, 9, 300, device=device)
    norm = torch.tensor(37.0) if normalizer == "tensor" else normalizer
    ref = oracle(hidden, weight, bias, labels, 300, normalizer=float(norm))
    out, gh, gw, gb = run(impl, hidden, weight, bias, labels, normalizer=norm)
    assert rel_err(out.loss, ref[0]) < 1e-5
    for got, want in zip((gh, gw, gb), ref[1:4]):
        assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_vocab_columns_take_no_part(impl, dtype, device):
    V, pad = 1000, 8
    hidden, weight, bias, labels = make_case(24, 16, V, dtype=dtype, pad=pad, device=device)
    bias[V:] = 50.0  # if the padding joined the softmax or the argmax, it would dominate both
    ref = oracle(hidden, weight, bias, labels, V)
    out, gh, gw, gb = run(impl, hidden, weight, bias, labels, vocab_size=V)
    assert rel_err(out.loss, ref[0]) < TOL[dtype]
    assert torch.equal(gw[V:], torch.zeros_like(gw[V:])) and torch.equal(
        gb[V:], torch.zeros_like(gb[V:])
    )
    assert rel_err(gh, ref[1]) < TOL[dtype] and rel_err(gw, ref[2]) < TOL[dtype]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_num_correct_counts_argmax_over_true_vocab(impl, dtype, device):
    # weight = identity on the first 8 hidden dims, so the logits ARE hidden[:, :8]: exact, no ties.
    V, pad, H = 8, 8, 16
    weight = torch.zeros(V + pad, H, dtype=dtype)
    weight[:V, :V] = torch.eye(V, dtype=dtype)
    bias = torch.zeros(V + pad, dtype=dtype)
    bias[V:] = 100.0
    hidden = torch.randperm(10 * H).reshape(10, H).to(dtype) / 32  # distinct values
    argmax = hidden[:, :V].argmax(-1)
    labels = torch.where(torch.arange(10) % 2 == 0, argmax, (argmax + 1) % V)
    labels[9] = IGNORE_INDEX  # row 9 never counts
    hidden, weight, bias, labels = (t.to(device) for t in (hidden, weight, bias, labels))
    out, *_ = run(impl, hidden, weight, bias, labels, vocab_size=V)
    assert int(out.num_correct) == 5 and int(out.num_masked) == 9


@pytest.mark.parametrize("impl", IMPLS)
def test_3d_noncontiguous_hidden_and_grad_output(impl, device):
    B, T, H, V = 3, 11, 16, 4097
    hidden_tbh, weight, bias, _ = make_case(B * T, 0, V, device=device)
    hidden = hidden_tbh.reshape(T, B, H).transpose(0, 1)  # [B, T, H], not contiguous
    labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    labels[:, ::3] = torch.randint(0, V, labels[:, ::3].shape)
    labels = labels.to(device)
    assert not hidden.is_contiguous()
    ref = oracle(hidden, weight, bias, labels, V)
    out, gh, gw, gb = run(impl, hidden, weight, bias, labels, scale=3.7)
    assert gh.shape == (B, T, H)
    assert rel_err(out.loss, ref[0]) < 1e-5
    for got, want in zip((gh, gw, gb), ref[1:4]):
        assert rel_err(got, 3.7 * want) < 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_fp16_loss_scaling(impl, device):
    """fp16 loss scaling multiplies the loss by 2**16: gradients scale exactly, no overflow."""
    hidden, weight, bias, labels = make_case(64, 20, 4097, dtype=torch.float16, device=device)
    _, gh1, gw1, gb1 = run(impl, hidden, weight, bias, labels)
    _, gh, gw, gb = run(impl, hidden, weight, bias, labels, scale=2.0**16, normalizer=20)
    for g, g1 in zip((gh, gw, gb), (gh1, gw1, gb1)):
        assert torch.isfinite(g).all()
        assert rel_err(g.double() / 2**16, g1.double()) < 4e-3


def test_triton_under_activation_checkpointing(device):
    """An encoder layer under torch.utils.checkpoint in front of the loss: same gradients."""
    torch.manual_seed(0)
    H, V = 16, 512
    layer = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.GELU()).to(device)
    hidden, weight, bias, labels = make_case(30, 10, V, device=device)
    grads = []
    for ckpt in (False, True):
        layer.zero_grad()
        w = weight.clone().requires_grad_()
        x = (
            torch.utils.checkpoint.checkpoint(layer, hidden, use_reentrant=False)
            if ckpt
            else layer(hidden)
        )
        kernels.masked_lm_loss(x, w, bias, labels, impl="triton").loss.backward()
        grads.append([w.grad] + [p.grad.clone() for p in layer.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def test_triton_second_backward_is_refused(device):
    hidden, weight, bias, labels = make_case(10, 4, 64, device=device)
    h = hidden.clone().requires_grad_()
    loss = kernels.masked_lm_loss(h, weight, bias, labels, impl="triton").loss
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward twice"):
        loss.backward()


def test_reference_gradcheck_float64(device):
    hidden, weight, bias, labels = make_case(
        7, 4, 10, H=5, dtype=torch.float64, pad=3, device=device
    )
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]

    def f(h, w, b):
        return kernels.masked_lm_loss(h, w, b, labels, vocab_size=10, impl="torch").loss

    assert torch.autograd.gradcheck(f, leaves)
    assert torch.autograd.gradgradcheck(f, leaves)


def test_bad_arguments_are_explained(device):
    hidden, weight, bias, labels = make_case(4, 2, 10, device=device)
    with pytest.raises(ValueError, match="'auto', 'triton', 'torch'"):
        kernels.masked_lm_loss(hidden, weight, bias, labels, impl="cuda")
    with pytest.raises(ValueError, match="vocab_size"):
        kernels.masked_lm_loss(hidden, weight, bias, labels, vocab_size=11)
    with pytest.raises(ValueError, match="leading shape"):
        kernels.masked_lm_loss(hidden, weight, bias, labels[:3])
    with pytest.raises(ValueError, match="weight"):
        kernels.masked_lm_loss(hidden, weight[:, :3], bias, labels)
    with pytest.raises(ValueError, match="normalizer"):
        kernels.masked_lm_loss(hidden, weight, bias, labels, normalizer=0)


def test_auto_picks_triton_only_for_cuda():
    assert _resolve_impl("auto", torch.device("cpu")) == "torch"
    assert _resolve_impl("auto", torch.device("cuda")) == "triton"
    assert _resolve_impl("torch", torch.device("cuda")) == "torch"


def test_import_and_fallback_without_triton():
    """Without triton: the torch path; impl="triton" raises; impl="auto" on CUDA tensors warns once,
    naming the import error, rather than falling back silently."""
    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` raise ImportError
        "import torch\nfrom bertforge.kernels import api as kernels\n"
        "h = torch.randn(4, 8); w = torch.randn(10, 8)\n"
        "y = torch.tensor([1, kernels.IGNORE_INDEX, 3, 9])\n"
        "out = kernels.masked_lm_loss(h, w, None, y)\n"
        "assert int(out.num_masked) == 3 and torch.isfinite(out.loss)\n"
        "try:\n"
        "    kernels.masked_lm_loss(h, w, None, y, impl='triton')\n"
        "except RuntimeError as e:\n"
        "    assert 'triton cannot be imported' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('impl=triton without triton must raise')\n"
        "import warnings\n"
        "from bertforge.kernels.api import _resolve_impl\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    picks = [_resolve_impl('auto', torch.device('cuda')) for _ in range(3)]\n"
        "assert picks == ['torch'] * 3, picks\n"
        "msgs = [str(w.message) for w in seen]\n"
        "assert len(msgs) == 1 and 'ModuleNotFoundError' in msgs[0], msgs\n"
    )
    proc = run_cli("-c", code, env={"TRITON_INTERPRET": "0"}, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


def test_matches_hf_style_all_position_loss(device):
    """The number the trainer logs equals F.cross_entropy(ignore_index) over all positions."""
    hidden, weight, bias, labels = make_case(40, 6, 777, device=device)
    hf = F.cross_entropy(F.linear(hidden, weight, bias), labels, ignore_index=IGNORE_INDEX)
    for impl in IMPLS:
        out = kernels.masked_lm_loss(hidden, weight, bias, labels, impl=impl)
        assert torch.allclose(out.loss, hf, rtol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_argmax_ties_go_to_the_first_index(impl, device):
    """As torch.argmax: on a tie the lowest column wins, also across the kernel's vocab blocks."""
    V, H = 40000, 4
    weight = torch.zeros(V, H, device=device)
    bias = torch.randn(V).clamp(max=3.0)
    bias[[3, 17, 39999]] = 5.0  # equal maxima in the first and last block
    labels = torch.tensor([3, 17, 39999, 3], device=device)
    out, *_ = run(impl, torch.randn(4, H, device=device), weight, bias.to(device), labels)
    assert int(out.num_correct) == 2


def test_autocast_bf16_both_impls_agree(device):
    """Under autocast the decoder runs in bf16 on fp32 parameters; the loss stays fp32."""
    hidden, weight, bias, labels = make_case(40, 15, 3001, pad=7, device=device)
    results = []
    for impl in IMPLS:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = kernels.masked_lm_loss(h, w, bias, labels, vocab_size=3001, impl=impl)
        out.loss.backward()
        assert out.loss.dtype == torch.float32 and w.grad.dtype == torch.float32
        results.append((out.loss.detach(), h.grad, w.grad))
    for a, b in zip(*results):
        assert rel_err(b, a.double()) < 1e-2


@needs_cuda
def test_auto_runs_the_triton_kernel_on_gpu(device, monkeypatch):
    """On CUDA tensors impl="auto" calls the kernel (not only resolves to it): torch's loss."""
    from bertforge.kernels import triton_ce

    calls = []
    real = triton_ce.ce_forward
    monkeypatch.setattr(triton_ce, "ce_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    hidden, weight, bias, labels = make_case(64, 20, 4097, device=device)
    out, *_ = run("auto", hidden, weight, bias, labels)
    ref, *_ = run("torch", hidden, weight, bias, labels)
    assert calls == [1]
    assert rel_err(out.loss, ref.loss.double()) < 1e-5


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_no_rows_by_vocab_buffer_beyond_the_logits_on_gpu(dtype, device):
    """Peak memory of one fwd+bwd with the kernel: the [rows x V] logits (reused for their own
    gradient) plus the parameter gradients; a second [rows x V] buffer would double it."""
    n_pos, n_rows, V, pad, H = 8192, 4096, 30522, 6, 256
    hidden, weight, bias, labels = make_case(
        n_pos, n_rows, V, H=H, dtype=dtype, pad=pad, device=device
    )
    h, w, b = (t.detach().clone().requires_grad_() for t in (hidden, weight, bias))
    elt = hidden.element_size()
    logits_bytes = n_rows * (V + pad) * elt
    param_grads = (w.numel() + b.numel()) * elt + h.numel() * elt
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    out = kernels.masked_lm_loss(h, w, b, labels, vocab_size=V, impl="triton")
    out.loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - start
    # slack: the gathered rows and their gradient, per-row fp32 stats, cuBLAS workspace
    slack = 4 * n_rows * H * elt + 64 * 2**20
    assert extra <= logits_bytes + param_grads + slack, (extra / 2**20, logits_bytes / 2**20)
    assert extra < 2 * logits_bytes  # a second [rows x V] buffer would not fit here
