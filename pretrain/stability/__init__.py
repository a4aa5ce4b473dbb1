"""Stability: the guard that discards or rolls back a bad step, and faults planned to test it."""
