"""Ember's version (kept apart so any layer can read it)."""

__version__ = "0.1.0"
