"""The masked-LM head + loss benchmark: ``python -m benchmarks.kernels.speed [--sweep]``.

- ``speed``: the entry; HF-style all-position logits against masked rows only, fused or not;
- ``sweep``: the loss alone over N_m x V x dtype, and the peak-bandwidth part;
- ``measure``: how one variant is measured (a ``Result`` row: ok, skipped or failed);
- ``cuda``: device HBM peaks and the CUDA-event (do_bench) timing.
"""
