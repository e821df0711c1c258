"""Rolling aggregations of a keyed stream, Flink's ``KeyedStream.reduce / sum / min / max /
minBy / maxBy``: no window, one output per input record — the key's aggregate so far — or,
with ``emit="batch"``, one per key and micro-batch: the key's aggregate after the batch's
records (the last of the per-record outputs; a compacted changelog of the same stream).

Each is a :class:`~ember.functions.KeyedProcessFunction` over one ``ValueState`` (the
running record), so it runs on Ember's keyed runtime like any process step: exactly once,
in savepoints, chainable with other stateful steps. Within a micro-batch a key's records
are folded in timestamp order when the stream has event time, else in arrival order.

What each emits (Flink's semantics):

- ``reduce(fn)``: the first record as it is, then ``fn(previous_result, record)``;
- ``sum / min / max(field)``: the key's *first* record with ``field`` replaced by the
  running sum / minimum / maximum (the other fields stay those of the first record);
- ``min_by / max_by(field)``: the record holding the minimum / maximum so far (the
  earlier one on ties).

A null ``field`` is skipped (the aggregate so far stays), as SQL aggregates skip nulls.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ember.errors import UserFunctionError
from ember.functions import Context, KeyedProcessFunction, RuntimeContext
from ember.state.descriptors import ValueStateDescriptor

__all__ = ["RollingReduce", "RollingField", "ROLLING_KINDS", "EMIT_MODES", "emits_per_record"]

EMIT_MODES = ("record", "batch")


def emits_per_record(fn: Any) -> bool:
    """Whether ``fn`` is a rolling aggregation emitting one output per input record."""
    return isinstance(fn, _Rolling) and fn.emit == "record"


class _Rolling(KeyedProcessFunction):
    """What the rolling functions share: the emit mode and its whole-batch path."""

    emit = "record"

    def process_batch(self, rt: Any, build: Any, keys: list[Any], columns: list[list[Any]], times: list[int] | None,
                      out: list[Any]) -> bool:
        """A bucket's micro-batch at once (the keyed runtime's batch path). ``emit="batch"``:
        per key, the records folded in order, only the last result emitted (with the key's
        last record's timestamp). Per record: a subclass's vectorised path, else False (the
        runtime calls ``process_element`` per record)."""
        if self.emit == "record":
            return self._vectorised(rt, build, keys, columns, times, out, last_only=False)
        if self._vectorised(rt, build, keys, columns, times, out, last_only=True):
            return True
        records = build(columns)
        positions: dict[Any, list[int]] = {}
        for i, key in enumerate(keys):
            positions.setdefault(key, []).append(i)
        for key, indices in positions.items():
            found = rt.enter(key)
            last = None
            for i in indices:
                rt.timestamp = times[i] if times is not None else None
                for result in self.process_element(records[i], rt) or ():
                    last = result
            if last is not None:
                if times is not None:
                    rt.emitting(out, times[indices[-1]])
                out.append(last)
            rt.leave(key, found)
        return True

    def _vectorised(self, rt: Any, build: Any, keys: list[Any], columns: list[list[Any]], times: list[int] | None,
                    out: list[Any], last_only: bool) -> bool:
        return False


class RollingReduce(_Rolling):
    """Emits ``fn(previous_result, record)`` per record (the first record as it is)."""

    def __init__(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]], emit: str = "record") -> None:
        self.fn, self.emit = fn, emit

    def open(self, ctx: RuntimeContext) -> None:
        self.acc = ctx.get_state(ValueStateDescriptor("rolling"))

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        previous = self.acc.value()
        result = value if previous is None else self.fn(previous, value)
        if not isinstance(result, dict):
            raise UserFunctionError(f"reduce function returned {type(result).__name__}, expected a record (dict)")
        self.acc.update(result)
        yield result


def _sum(acc: Any, value: Any) -> Any:
    return acc + value


def _min(acc: Any, value: Any) -> Any:
    return value if value < acc else acc


def _max(acc: Any, value: Any) -> Any:
    return value if value > acc else acc


ROLLING_KINDS: dict[str, Callable[[Any, Any], Any]] = {"sum": _sum, "min": _min, "max": _max}


class RollingField(_Rolling):
    """``sum``/``min``/``max`` of one field (on the key's first record), or with ``by``
    the record holding the minimum (``min``) or maximum (``max``) of the field."""

    def __init__(self, kind: str, field: str, by: bool = False, emit: str = "record") -> None:
        if kind not in ROLLING_KINDS or (by and kind == "sum"):
            raise ValueError(f"no rolling {kind}{'_by' if by else ''}")
        self.kind, self.field, self.by, self.emit = kind, field, by, emit

    def open(self, ctx: RuntimeContext) -> None:
        self.acc = ctx.get_state(ValueStateDescriptor("rolling"))
        self.combine = ROLLING_KINDS[self.kind]
        self._fields: tuple[str, ...] = ()  # the records' field names, learnt from the first batch

    def _vectorised(self, rt: Any, build: Any, keys: list[Any], columns: list[list[Any]], times: list[int] | None,
                    out: list[Any], last_only: bool) -> bool:
        """Per key, the running ``sum``/``min``/``max`` of the batch's values with numpy
        (cumulative, in the records' order) on top of the key's state: the same records as one
        ``process_element`` per record (``last_only``: each key's last). False (per record) for
        ``min_by``/``max_by``, a field that is not all numbers (nulls, say), or, per record, when
        a next step needs each output's timestamp."""
        marks = getattr(rt, "marks", None) is not None
        if self.by or (marks and (not last_only or times is None)) or not keys:
            return False
        import numpy as np
        import pandas as pd

        if not self._fields:
            self._fields = tuple(build([[c[0]] for c in columns])[0])
        fields, field = self._fields, self.field
        position = fields.index(field)
        values = np.asarray(columns[position])
        if values.ndim != 1 or values.dtype.kind not in "iuf" or (values.dtype.kind == "f" and np.isnan(values).any()):
            return False  # (a null as pandas' NaN: the per-record path decides)
        codes, uniques = pd.factorize(pd.Series(keys, dtype=object), sort=False)
        order = np.argsort(codes, kind="stable")  # each key's records, in the batch's order
        sorted_codes = codes[order]
        edges = np.r_[0, np.flatnonzero(np.diff(sorted_codes)) + 1, len(order)].tolist()
        running: Any = {"sum": np.cumsum, "min": np.minimum.accumulate, "max": np.maximum.accumulate}[self.kind]
        onto: Any = {"min": np.minimum, "max": np.maximum}.get(self.kind)
        result: list[list[Any]] = [[] for _ in fields]
        for a, b in zip(edges, edges[1:]):
            rows = order[a:b]
            key = uniques[sorted_codes[a]]
            found = rt.enter(key)
            previous = self.acc.value()
            base = previous if previous is not None else {f: c[int(rows[0])] for f, c in zip(fields, columns)}
            start = base[field] if previous is not None else None
            if start is None:
                totals = running(values[rows])
            elif self.kind == "sum":  # start first: the same additions, in the same order, as per record
                totals = running(np.r_[start, values[rows]])[1:]
            else:
                totals = onto(running(values[rows]), start)
            totals_list = totals.tolist()
            if last_only:
                totals_list = totals_list[-1:]
                if marks:
                    assert times is not None
                    rt.emitting(out, times[int(rows[-1])])
                    out.append({**base, field: totals_list[-1]})
            n = len(totals_list)
            if not marks:
                for f, column in zip(fields, result):
                    column.extend(totals_list if f == field else [base.get(f)] * n)
            self.acc.update({**base, field: totals_list[-1]})
            rt.leave(key, found)
        if not marks:
            out.extend(build(result))
        return True

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        previous = self.acc.value()
        field = self.field
        new = value.get(field)
        if previous is None:
            result = value
        elif new is None:
            result = previous
        elif previous[field] is None:
            result = value if self.by else {**previous, field: new}
        elif self.by:  # the new record only when strictly better: the earlier one wins ties
            better = new < previous[field] if self.kind == "min" else new > previous[field]
            result = value if better else previous
        else:
            result = {**previous, field: self.combine(previous[field], new)}
        if result is not previous:
            self.acc.update(result)
        yield result
