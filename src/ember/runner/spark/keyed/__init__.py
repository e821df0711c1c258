"""Keyed execution: many keys and their state per Spark call, in bulk."""

from __future__ import annotations

import warnings

__all__ = ["quiet_worker_warnings"]

# pyspark's worker concatenates a state group's frames with pandas, which warns (a
# FutureWarning, pandas >= 2.1) whenever one of them is empty — each bucket called without
# records. Neither Ember's code nor its user's: it flooded the output of every window job.
EMPTY_CONCAT_WARNING = "The behavior of DataFrame concatenation with empty or all-NA entries"


def quiet_worker_warnings() -> None:
    """Silence pyspark's worker's empty-frame concatenation warning in this process (a Python
    worker imports this package with the first keyed function it unpickles)."""
    warnings.filterwarnings("ignore", message=EMPTY_CONCAT_WARNING, category=FutureWarning, module="pyspark.worker")


quiet_worker_warnings()
