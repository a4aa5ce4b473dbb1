"""BERT pretraining on DeepSpeed: model, data pipeline, trainer (see docs/design.md)."""
