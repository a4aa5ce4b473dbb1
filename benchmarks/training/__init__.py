"""The trainer and the model, measured on the CPU.

- ``trainer``: tokens/s of our DeepSpeed trainer vs HF Trainer;
- ``launch``: start-up cost of the rendezvous check;
- ``model_step``: one forward+backward step, ours vs transformers' BertForMaskedLM;
- ``modernbert``: our ModernBERT vs transformers' under HF Trainer; ``local_attention``: a
  sliding-window layer's cost; ``step_profile``: where one step's time goes;
- ``chaos``: a 2-rank run killed at random moments ends bit-identical (docs/reliability.md).
"""
