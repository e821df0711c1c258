"""Rolling aggregations of a keyed stream, Flink's ``KeyedStream.reduce / sum / min / max /
minBy / maxBy``: no window, one output per input record — the key's aggregate so far.

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

__all__ = ["RollingReduce", "RollingField", "ROLLING_KINDS"]


class RollingReduce(KeyedProcessFunction):
    """Emits ``fn(previous_result, record)`` per record (the first record as it is)."""

    def __init__(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> None:
        self.fn = fn

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


class RollingField(KeyedProcessFunction):
    """``sum``/``min``/``max`` of one field (on the key's first record), or with ``by``
    the record holding the minimum (``min``) or maximum (``max``) of the field."""

    def __init__(self, kind: str, field: str, by: bool = False) -> None:
        if kind not in ROLLING_KINDS or (by and kind == "sum"):
            raise ValueError(f"no rolling {kind}{'_by' if by else ''}")
        self.kind, self.field, self.by = kind, field, by

    def open(self, ctx: RuntimeContext) -> None:
        self.acc = ctx.get_state(ValueStateDescriptor("rolling"))
        self.combine = ROLLING_KINDS[self.kind]

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
