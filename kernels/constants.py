"""Constants shared by the kernels, the model, the trainer and the benchmarks (one of each)."""

from __future__ import annotations

# Label of a position that takes no part in the loss (PyTorch's F.cross_entropy default).
IGNORE_INDEX = -100
