"""GLUE and CLUE the way the field reports them (``bertforge evaluate --glue DIR``).

The tasks and their files are :mod:`pretrain.data.glue` (``tasks``, ``readers``); here:
``protocols``: the papers' presets; ``finetune``: one run; ``suite``: models x tasks x lrs x
seeds, MNLI first; ``scores``: the metrics; ``report``: table, ``glue.json`` and the
score-against-step plot.
"""
