"""Every measurement quoted in docs/benchmarks.md, one module each, grouped by family.

Run any of them from the repository root as ``python -m benchmarks.<family>.<name> --help``:

- ``kernels``: the masked-LM head + loss (``speed``) and its sweep, CUDA timing and measurement;
- ``gpu_check``: one command that validates a GPU node and measures the GPU claims
  (``python -m benchmarks.gpu_check``, ``make gpu-check``);
- ``learning``: held-out loss per wall-clock hour against HF Trainer (``per_hour``, scored by
  ``evaluator``) and continued pretraining against from scratch (``continued``);
- ``data``: ``data_prep`` throughput (``prep``), decontamination (``decontam``) and the training
  loader (``loader``);
- ``training``: trainer tokens/s (``trainer``), rendezvous cost (``launch``), one model step
  (``model_step``) and cross-layer sharing (``share_layers``).

What several of them share (the repository root, the tiny-model tokenizer's shards, the metric
readers) lives in ``benchmarks.common``.
"""
