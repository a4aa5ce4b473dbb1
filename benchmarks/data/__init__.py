"""The data path, each side by side with the usual Hugging Face way.

- ``prep``: ``data_prep build`` tokens/s and bytes/token vs the run_mlm.py way;
- ``decontam``: decontamination speed and what it finds among planted near-duplicates;
- ``loader``: the training loader (shards + dynamic masking + collation) vs HF's collators.
"""
