"""What one window step declares (:class:`WindowSpec`), the slots it keeps in a key's
state, and which execution path its micro-batches take (:class:`WindowPath`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ember.functions import AggregateFunction, OutputTag
from ember.windowing.assigners import SlidingWindows, TumblingWindows, WindowAssigner
from ember.windowing.evictors import Evictor
from ember.windowing.triggers import EventTimeTrigger, Trigger, count_window_size, fires_on_time_only

__all__ = [
    "WindowSpec", "WindowPath", "WINDOWS", "TRIGGER_STATE", "WINDOW_EVENT_TIMERS", "WINDOW_PROC_TIMERS",
    "LATE_COUNTER", "PARTIAL_START", "PARTIAL_ACC", "PARTIAL_COUNT", "MARKER",
]

# Reserved slot entries of a key: window contents, trigger state, which windows wait for which timer.
WINDOWS, TRIGGER_STATE = "\x00windows", "\x00trigger"
WINDOW_EVENT_TIMERS, WINDOW_PROC_TIMERS = "\x00wt_event", "\x00wt_proc"
LATE_COUNTER = "late_dropped"
# Columns of a partial aggregate (with the key fields) sent from the combiner to the window step.
# A combiner's partial: the window start, the accumulator, the records whose last window it is.
PARTIAL_START, PARTIAL_ACC, PARTIAL_COUNT = "__ember_window_start", "__ember_acc", "__ember_records"
# On a combiner's row that carries no partial, only the partition's latest event time: the
# state bucket it is for (each bucket gets one, for the step's in-batch watermark, bucket.py).
MARKER = "__ember_marker_bucket"


class WindowPath(enum.Enum):
    """The ways a micro-batch runs through the operator, all with the per-element
    path's semantics and state (so a job can switch paths across a restart):

    - ``PARTIALS``: the input is partial aggregates from the combiner before the
      shuffle; each is merged into its window (batch.PartialsPath).
    - ``COUNT``: a tumbling count window with an incremental function: one pass
      over each key's records, advancing the trigger's counter (batch.CountPath).
    - ``TIME_BATCH``: fixed time windows whose trigger depends on time only, with an
      incremental function: records grouped by (key, window), the trigger called
      once per new window; records behind the watermark go one by one (batch.TimeBatchPath).
    - ``ELEMENT``: everything else — sessions, evictors, whole-window functions,
      custom triggers: Flink's per-element algorithm (operator.WindowOperator).
    """

    PARTIALS = "partials"
    COUNT = "count"
    TIME_BATCH = "time batch"
    ELEMENT = "element"


@dataclass(frozen=True)
class WindowSpec:
    """Everything one window step declares (built by the API, validated there)."""

    assigner: WindowAssigner
    trigger: Trigger
    evictor: Evictor | None = None
    allowed_lateness_ms: int = 0
    late_tag: OutputTag | None = None
    aggregate: AggregateFunction | None = None
    reduce: Any = None
    window_function: Any = None  # ProcessWindowFunction
    key_names: tuple[str, ...] = ()
    result_fields: tuple[str, ...] = ()  # aggregate results without a window function
    step: str = "window"
    combined: bool = False  # the input is partial aggregates from batch.make_combiner
    dead_letter: str | None = None  # the side output for records add / reduce raises on (per element only)

    @property
    def combinable(self) -> bool:
        """Whether partial aggregation before the shuffle gives exactly the same output:
        event-time fixed windows with the default trigger and an AggregateFunction; no
        evictor, no allowed lateness (each late element would fire again), no late-data
        side output (it needs the late records themselves) and no dead letters (each
        record's add is guarded on its own)."""
        return (
            isinstance(self.assigner, TumblingWindows | SlidingWindows)
            and not self.assigner.processing_time
            and type(self.trigger) is EventTimeTrigger
            and self.evictor is None
            and self.aggregate is not None
            and self.allowed_lateness_ms == 0
            and self.late_tag is None
            and self.dead_letter is None
        )

    @property
    def keeps_elements(self) -> bool:
        """Whether a window holds its elements (evictor, or a whole-window function alone)."""
        return self.evictor is not None or (self.aggregate is None and self.reduce is None)

    @property
    def path(self) -> WindowPath:
        """How the operator takes a micro-batch (chosen once per step)."""
        if self.combined:
            return WindowPath.PARTIALS
        if self.keeps_elements or self.evictor is not None or self.dead_letter is not None:
            return WindowPath.ELEMENT  # (dead letters: each record's add guarded on its own)
        if self.assigner.is_global and count_window_size(self.trigger) is not None:
            return WindowPath.COUNT
        if isinstance(self.assigner, TumblingWindows | SlidingWindows) and fires_on_time_only(self.trigger):
            return WindowPath.TIME_BATCH
        return WindowPath.ELEMENT
