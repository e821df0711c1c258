"""Keyed execution: many keys and their state per Spark call, in bulk."""
