"""``python -m pretrain.export RUN OUT``: a checkpoint as a HF model folder with a model card."""
