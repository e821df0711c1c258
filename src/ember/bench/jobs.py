"""Reference jobs shared by the examples and the benchmarks."""

from __future__ import annotations

from typing import Any, Iterator

from ember.api.functions import AggregateFunction, Context, KeyedProcessFunction, RuntimeContext
from ember.connectors.generators import STATE_NAMES, TRANSITIONS
from ember.state.descriptors import ValueStateDescriptor

__all__ = ["StateMachine", "ALERT_SCHEMA", "CountAggregate"]

TERMINAL = 5
ALERT_SCHEMA = "address int, state string, type int"


class StateMachine(KeyedProcessFunction):
    """Flink's state-machine example (WORKLOADS.md E4): one state per address,
    an alert ``(address, state, type)`` for every invalid transition."""

    def open(self, ctx: RuntimeContext) -> None:
        self.state = ctx.get_state(ValueStateDescriptor("state", default=0))

    def process_element(self, event: dict[str, Any], ctx: Context) -> Iterator[tuple]:
        current = self.state.value()
        following = TRANSITIONS.get(current, {}).get(event["type"])
        if following is None:
            yield (event["address"], STATE_NAMES[current], event["type"])
        elif following == TERMINAL:
            self.state.clear()
        else:
            self.state.update(following)


class CountAggregate(AggregateFunction):
    """Counts records: the Python AggregateFunction of ``ember bench window``."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, Any], acc: int) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def get_result(self, acc: int) -> int:
        return acc
