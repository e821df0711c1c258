"""Ember's dashboard: a live web page of a running job (the steps users wrote, with
records in and out, sources' lag and watermarks, batches, checkpoints, late records,
dead letters and errors), ``/metrics`` for Prometheus and ``/api/...`` JSON.

``env.execute(..., ui=True)`` or ``ember run JOB --ui``; guide: docs/dashboard.md.
"""

from ember.ui.model import JobMonitor
from ember.ui.server import DEFAULT_HOST, DEFAULT_PORT, Dashboard

__all__ = ["JobMonitor", "Dashboard", "DEFAULT_HOST", "DEFAULT_PORT"]
