"""Validate a GPU node and measure every GPU claim in one command:
``python -m benchmarks.gpu_check`` (``make gpu-check``; ``--dry-run`` runs the same code on the
CPU at tiny sizes).

- ``__main__``: the command line and the order of the parts;
- ``common``: the plans (GPU and dry run), a part's result, time boxes, the subprocess runner;
- ``parts``: the data and kernel parts (shards, kernel tests, kernel sweep, head);
- ``train``: the training parts (trainer throughput, the HF baseline, resume);
- ``report``: environment, targets and OUT/gpu_check.json and .md.
"""
