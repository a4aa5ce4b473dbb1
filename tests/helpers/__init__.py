"""Helpers the tests share (fixtures stay in tests/conftest.py): running commands as a user
would, building shards, launching the trainer, reading commands out of the docs."""
