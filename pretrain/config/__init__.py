"""Typed configuration: flags, the DeepSpeed-config resolver, batch sizes, precision."""
