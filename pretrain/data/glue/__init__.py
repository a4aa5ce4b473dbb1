"""GLUE and CLUE as files: ``tasks`` (each task's files, columns, labels, head, metrics and the
benchmark score) and ``readers`` (the classic files and Hugging Face's copies, checked).

Here in the data layer, beside ``downstream_tasks``, so that the trainer can check a
``--downstream_eval glue:DIR`` folder at launch; fine-tuning and scoring them is
:mod:`pretrain.evaluate.glue`.
"""
