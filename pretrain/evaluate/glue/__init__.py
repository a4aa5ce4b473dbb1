"""GLUE and CLUE the way the field reports them (``python -m pretrain.evaluate --glue DIR``).

``tasks``: each task's files, columns, labels, head and metrics, and the benchmark score;
``readers``: the classic files and Hugging Face's copies; ``protocols``: the papers' presets;
``finetune``: one run; ``suite``: models x tasks x lrs x seeds, MNLI first; ``scores``: the
metrics; ``report``: table, ``glue.json`` and the score-against-step plot.
"""
