"""The Triton kernels compile for H100/H200 (sm_90) down to a cubin, without a GPU.

The interpreter (TRITON_INTERPRET=1) used by the other tests is lenient about types; this catches
what only the real compiler rejects (loop-carried dtypes, pointer arithmetic, stores of the wrong
element type) on a CPU-only machine. Runs in a subprocess because the interpreter mode is fixed
when triton is first imported.
"""

from __future__ import annotations

from helpers.commands import run_cli

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bertforge.kernels import triton_ce as T

common = {"labels_ptr": "*i64", "labels_stride": "i64", "vocab_size": "i32",
          "ignore_index": "i32", "BLOCK": "constexpr"}
fwd = {"logits_ptr": "*DT", "logits_row_stride": "i64", "loss_ptr": "*fp32", "lse_ptr": "*fp32",
       "correct_ptr": "*i32", **common}
bwd = {"logits_ptr": "*DT", "logits_row_stride": "i64", "grad_ptr": "*DT", "grad_row_stride": "i64",
       "lse_ptr": "*fp32", "dloss_ptr": "*fp32", "dloss_stride": "i64", "n_cols": "i32", **common}
for fn, sig in ((T._ce_forward_kernel, fwd), (T._ce_backward_kernel, bwd)):
    order = list(fn.arg_names)
    for dt in ("bf16", "fp16", "fp32"):
        s = {k: sig[k].replace("DT", dt) for k in order}
        src = ASTSource(fn=fn, signature=s, constexprs={"BLOCK": 4096})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        assert len(k.asm["cubin"]) > 1000, (fn.__name__, dt)
        print(fn.__name__, dt, "ok")
"""


def test_kernels_compile_for_sm90(tmp_path):
    env = {
        "TRITON_INTERPRET": "0",
        "TRITON_DEFAULT_FP_FUSION": "1",
        "TRITON_CACHE_DIR": str(tmp_path),
    }
    proc = run_cli("-c", SCRIPT, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count(" ok") == 6
