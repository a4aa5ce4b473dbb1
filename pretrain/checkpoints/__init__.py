"""Checkpoints during training: saving, pruning under leases, the resume point, its lr schedule."""
