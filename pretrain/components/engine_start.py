"""Start-up work DeepSpeed does that this trainer never needs, left out.

``deepspeed.initialize`` with ZeRO checks that the optimizer is one ZeRO supports, and on every
call first imports its Muon optimizer to add it to that list (DeepSpeed 0.19:
``runtime/zero/utils.py``, ``is_zero_supported_optimizer``). That import compiles Muon's kernels
with ``torch.compile``, which imports inductor: 2.0-2.3 s of CPU on every rank of every launch
(measured on this 2-core machine), before the first step. The trainer builds only AdamW or LAMB
(:mod:`pretrain.config.optimizer` refuses any other type), so Muon never needs to be on the list;
DeepSpeed treats the module as absent when its import fails, and that is what
:func:`without_muon` arranges for the duration of the call.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


@contextmanager
def without_muon() -> Iterator[None]:
    """Make DeepSpeed's Muon module fail to import inside the block (unless something already
    imported it: then it is left as it is)."""
    if MUON_MODULE in sys.modules:
        yield
        return
    sys.modules[MUON_MODULE] = None  # type: ignore[assignment]  # import now raises ImportError
    try:
        yield
    finally:
        if sys.modules.get(MUON_MODULE, 0) is None:
            del sys.modules[MUON_MODULE]
