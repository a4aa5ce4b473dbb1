"""The model: the BERT encoder with heads on masked rows, and initial weights (--init_from)."""
