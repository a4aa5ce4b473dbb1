"""One-off experiments: each answered one question; see experiments/README.md for what it answered,
where its numbers are and the command that reproduces it. Experiments may import ``benchmarks``
(the shared helpers), never the reverse."""
