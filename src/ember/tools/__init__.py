"""Operational tools: ``ember produce`` and ``ember chaos``."""
