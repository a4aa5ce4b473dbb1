"""Downstream evaluation measured against transformers' own Trainer.

- ``glue_trainer``: one GLUE fine-tuning run with ``transformers.Trainer`` (the reference of the
  parity test, tests/pretrain/evaluate/test_glue_parity.py) and the same run with ours
  (``pretrain.evaluate.glue.finetune``), both on the examples our readers load;
- ``glue_throughput``: train examples/s of the two sides on one task, alternating, repeated
  (``python -m benchmarks.evaluation.glue_throughput``; docs/benchmarks.md quotes it).
"""
