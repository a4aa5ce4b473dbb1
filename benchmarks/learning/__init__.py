"""How well a model learns for the wall-clock time it gets.

- ``per_hour``: held-out MLM loss against time, our trainer vs HF Trainer
  (``python -m benchmarks.learning.per_hour``);
- ``evaluator``: the one evaluator both sides are scored with (held-out loss of saved models);
- ``continued``: continued pretraining vs from scratch, and how new token rows are initialised
  (``python -m benchmarks.learning.continued``).
"""
