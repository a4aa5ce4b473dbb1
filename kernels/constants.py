"""Constants shared by the kernel and its callers (one definition each)."""

IGNORE_INDEX = -100  # label of a position that takes no part in the loss (PyTorch's convention)
