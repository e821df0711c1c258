"""Spark's reused Python workers collect only their young objects after each task.

PySpark's worker daemon forks a process per concurrent task and, with worker reuse (Spark's
default), runs task after task in it — calling ``gc.collect()`` after each one: a *full*
collection, which walks every object the process holds. An Ember worker holds pandas,
pyarrow, numpy, pyspark and Ember's modules and whatever state its tasks keep: measured
(2026-11-29, one fan-out job of tests/integration/test_fan_out.py, 10 micro-batches of a few
records), 365 such collections took 56 s of CPU in a 42 s run on 2 cores — 150 ms each on
average, up to 340 ms, growing with the tasks a process ran. They run after a task has sent
its results, so a lone job mostly hides them, but they take the CPU from every other task
and job (docs/design/latency.md, "The workers' collections after each task").

:func:`install` — run on importing :mod:`ember.runner.spark`, so in every worker that runs
Ember's code — makes that collection, in a forked worker of PySpark's daemon only, collect
the young generations (what the task allocated and did not free) and the whole heap every
:data:`FULL_EVERY` tasks. Python's own collector still runs the full collections its
thresholds call for, so unreachable cycles are still freed. Nothing changes anywhere else:
the driver, a ``gc.collect()`` in user code (it sees the real module) or a pyspark whose
daemon is not shaped as this expects (then nothing is patched). ``EMBER_WORKER_GC=full`` (in
the driver's environment, which local workers inherit) keeps PySpark's full collections:
benchmarks/worker_gc.py measures both.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

__all__ = ["FULL_EVERY", "KEEP_FULL", "AfterTaskCollector", "install"]

FULL_EVERY = 64  # tasks between full collections in one worker (each ~0.1-0.3 s here)
KEEP_FULL = "EMBER_WORKER_GC"  # set to "full": PySpark's full collection after every task


class AfterTaskCollector:
    """``gc`` as PySpark's daemon sees it: ``collect()`` (a full collection, after each task)
    collects generations 0 and 1, and every ``full_every``-th call the whole heap; everything
    else is the real module's."""

    def __init__(self, full_every: int = FULL_EVERY) -> None:
        self.full_every, self.calls = full_every, 0

    def collect(self, generation: int = 2) -> int:
        self.calls += 1
        if self.calls % self.full_every == 0:
            return gc.collect(generation)
        return gc.collect(min(generation, 1))

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def install(main: Any = None) -> bool:
    """In a forked worker of PySpark's daemon (``__main__`` is ``pyspark.daemon`` and holds
    the ``gc`` module), give the daemon an :class:`AfterTaskCollector`; True if it did."""
    if os.environ.get(KEEP_FULL) == "full":
        return False
    main = sys.modules.get("__main__") if main is None else main
    spec = getattr(main, "__spec__", None)
    if spec is None or spec.name != "pyspark.daemon" or getattr(main, "gc", None) is not gc:
        return False
    main.gc = AfterTaskCollector()
    return True
