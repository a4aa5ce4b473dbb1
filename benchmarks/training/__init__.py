"""The trainer and the model, measured on the CPU.

- ``trainer``: tokens/s of our DeepSpeed trainer vs HF Trainer;
- ``launch``: start-up cost of the rendezvous check;
- ``model_step``: one forward+backward step, ours vs transformers' BertForMaskedLM;
- ``share_layers``: cross-layer sharing (``--share_layers``) side by side on one budget.
"""
