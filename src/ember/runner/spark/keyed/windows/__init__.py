"""Flink's window operator on Ember's keyed state (operator.py), for the windows Spark
has no native form for; declared by a :class:`WindowSpec` (spec.py), run per element
or on a whole-batch path (batch.py), with the contexts user code gets (contexts.py)."""

from ember.runner.spark.keyed.windows.batch import make_combiner
from ember.runner.spark.keyed.windows.operator import WindowOperator
from ember.runner.spark.keyed.windows.spec import (
    LATE_COUNTER,
    MARKER,
    PARTIAL_ACC,
    PARTIAL_COUNT,
    PARTIAL_START,
    WindowPath,
    WindowSpec,
)

__all__ = [
    "WindowOperator", "WindowSpec", "WindowPath", "make_combiner",
    "LATE_COUNTER", "PARTIAL_START", "PARTIAL_ACC", "PARTIAL_COUNT", "MARKER",
]
