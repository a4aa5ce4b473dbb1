"""Foundations shared by ``data_prep`` and ``pretrain``: one error base, one log voice, one way to
write a file or publish a folder so that a crash never leaves half of it."""
