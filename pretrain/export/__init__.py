"""``bertforge export RUN OUT``: a checkpoint as a HF model folder with a model card."""
