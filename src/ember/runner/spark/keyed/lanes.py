"""Several keyed steps as lanes of one ``transformWithStateInPandas`` operator (a fan-out).

A Spark query is a tree: a stateful step whose output two steps read would be planned
twice, state and user calls included. When several keyed steps read one keyed step's
output (fan_out_plan.FanOut), they run instead as *lanes* of one operator: every input row
carries its lane, the grouping key is ``lane * buckets + state bucket``, and this
processor hands each group to its lane's processor (keyed/tws.py) with the bucket it
would have alone — so a lane's state, timers and outputs are the step's own. A lane
without a processor passes its rows through unchanged, still packed (one output row per
packed input row, :data:`PACKED_ROWS` under the lane's prefix): the rows other branches
(sinks) read from the fanned-out step, unpacked after the split.

Each output row carries its lane (``LANE``) and its fields under the lane's prefix
(:func:`lane_column`); the other lanes' columns are null. The job splits after this
operator, and each branch takes its lane's rows back under their own names
(translators/fanout.py).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pandas as pd
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, StatefulProcessor, StatefulProcessorHandle, TimerValues

from ember.runner.spark.keyed.packing import PACKED_ROWS

__all__ = ["LANE", "lane_column", "LanesProcessor"]

LANE = "__ember_lane"


def lane_column(lane: int, name: str) -> str:
    """Lane ``lane``'s field ``name`` on the shared operator's output."""
    return f"__ember_lane{lane}_{name}"


class _SharedHandle:
    """The operator's state handle as each lane sees it: a state variable every lane
    declares (``blob``, ``timer``, ``parts``...) is declared once and shared — each grouping
    key is one lane's bucket, so the lanes' values never meet."""

    def __init__(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        self._declared: dict[tuple[str, str], tuple[Any, Any]] = {}

    def _declare(self, kind: str, name: str, schema: Any, *rest: Any) -> Any:
        known = self._declared.get((kind, name))
        if known is not None:
            if str(known[0]) != str(schema):
                raise ValueError(f"two lanes declare the state '{name}' with different types: {known[0]} and {schema}")
            return known[1]
        made = getattr(self._handle, kind)(name, schema, *rest)
        self._declared[(kind, name)] = (schema, made)
        return made

    def getValueState(self, name: str, schema: Any, *rest: Any) -> Any:  # noqa: N802 - Spark's names
        return self._declare("getValueState", name, schema, *rest)

    def getListState(self, name: str, schema: Any, *rest: Any) -> Any:  # noqa: N802
        return self._declare("getListState", name, schema, *rest)

    def __getattr__(self, name: str) -> Any:  # timers and the rest: the operator's own
        return getattr(self._handle, name)


class LanesProcessor(StatefulProcessor):
    """Dispatches each group of the shared operator to its lane's processor.

    ``lanes[i]``: lane ``i``'s processor (a keyed/tws.py ``BucketProcessor``), or None
    for the pass-through lane; ``outputs[i]``: its output columns; ``anchor``: the null
    event-time column Spark's watermark rides on, or None; ``buckets``: the state buckets
    per lane (the job's ``max_parallelism``); ``lane``: the output column naming each row's
    lane (one per level of a fan-out)."""

    def __init__(self, lanes: list[Any], outputs: list[list[str]], anchor: str | None, buckets: int,
                 lane: str = LANE) -> None:
        self.lanes, self.outputs, self.anchor, self.buckets, self.lane = lanes, outputs, anchor, buckets, lane
        self.columns: list[str] = []
        self.names = [lane] + [lane_column(i, c) for i, cols in enumerate(outputs) for c in cols]
        if anchor is not None:
            self.names.append(anchor)

    def read(self, columns: list[str]) -> None:
        """The grouped input's columns (Spark hands them over unnamed: keyed/tws.py)."""
        self.columns = list(columns)
        for proc in self.lanes:
            if proc is not None:
                proc.columns = self.columns

    def init(self, handle: StatefulProcessorHandle) -> None:
        shared = _SharedHandle(handle)
        for proc in self.lanes:
            if proc is not None:
                proc.init(shared)

    def _dispatch(self, key: Any, rows: Iterator[pd.DataFrame], timer_values: TimerValues,
                  fired: int | None) -> Iterator[pd.DataFrame]:
        lane, bucket = divmod(int(key[0]), self.buckets)
        proc = self.lanes[lane]
        frames = self._through(rows) if proc is None else proc._run((bucket,), rows, timer_values, fired)
        for pdf in frames:
            if len(pdf):
                yield self._widen(lane, pdf)

    def _through(self, rows: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in rows:
            pdf.columns = self.columns
            yield pdf[[PACKED_ROWS]]

    def _widen(self, lane: int, pdf: pd.DataFrame) -> pd.DataFrame:
        """``pdf`` (lane ``lane``'s rows) in the operator's output shape."""
        n = len(pdf)
        data: dict[str, Any] = {self.lane: np.full(n, lane, dtype=np.int32)}
        empty = pd.Series([None] * n, dtype=object)
        for i, cols in enumerate(self.outputs):
            for c in cols:
                data[lane_column(i, c)] = pdf[c].reset_index(drop=True) if i == lane else empty
        if self.anchor is not None:
            data[self.anchor] = pd.Series([None] * n, dtype="datetime64[us, UTC]")
        return pd.DataFrame(data, columns=self.names)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        return self._dispatch(key, rows, timerValues, None)

    def handleExpiredTimer(  # noqa: N802
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        return self._dispatch(key, iter(()), timerValues, expiredTimerInfo.getExpiryTimeInMs())

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues) -> None:  # noqa: N802,N803
        """A converted checkpoint's first micro-batch (keyed/tws.py): the bucket's state to its lane."""
        lane, bucket = divmod(int(key[0]), self.buckets)
        proc = self.lanes[lane]
        if proc is not None:  # (its timers on this operator's time: the lanes' processors have no anchor)
            proc.seed((bucket,), initialState, timerValues, self.anchor is not None)

    def close(self) -> None:
        pass
