"""Run pretrain/main.py with fp16 enabled on a CPU, for tests of the loss-scaling path.

DeepSpeed refuses fp16 on CPUs without mkldnn fp16 support; its CPU kernels still run fp16
ZeRO-2/3 with dynamic loss scaling once the capability check is patched (see
docs in ../shared/notes/deepspeed.md). ``BERTFORGE_TEST_INF_AT_STEP=N`` multiplies the loss by
inf in the backward passes of optimizer step N (1-based, once per process) to force an overflow.
"""

from __future__ import annotations

import os
import sys

from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.engine import DeepSpeedEngine

type(get_accelerator()).is_fp16_supported = lambda self: True

_INF_STEP = int(os.environ.get("BERTFORGE_TEST_INF_AT_STEP", "0"))
_original_backward = DeepSpeedEngine.backward


def _backward(self, loss, *args, **kwargs):
    # global_steps counts completed optimizer steps: step N runs while it equals N - 1.
    if _INF_STEP and self.global_steps == _INF_STEP - 1:
        loss = loss * float("inf")
    return _original_backward(self, loss, *args, **kwargs)


DeepSpeedEngine.backward = _backward

if __name__ == "__main__":
    from bertforge.pretrain.main import main

    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as pretrain/main.py: skip the slow native teardown of the gloo group
