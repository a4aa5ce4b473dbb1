"""Offline data preparation: raw text to packed, pre-tokenized, memory-mappable shards.

`bertforge prep build|prepare|merge|inspect|verify|check-overlap`; the trainer reads
shards with `data_prep.reader.ShardReader`. This package import stays light (numpy only) so
that DataLoader workers and build workers start fast.
"""

from bertforge.data_prep.layout import FORMAT_VERSION
from bertforge.data_prep.reader import Sample, ShardError, ShardReader

__all__ = ["FORMAT_VERSION", "Sample", "ShardError", "ShardReader"]
