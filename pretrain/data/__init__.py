"""The data path of training: shard loader, dynamic masking, mixtures, shard checks."""
