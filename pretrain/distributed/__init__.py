"""Distributed start-up: the rendezvous, op builds, shared-memory buffers and the rank watchdog."""
