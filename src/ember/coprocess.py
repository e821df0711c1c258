"""Two connected keyed streams as one input of Ember's keyed runtime.

``a.connect(b).key_by(ka, kb).process(fn)`` runs ``fn`` (a
:class:`~ember.functions.KeyedCoProcessFunction`) as one keyed step: the runner unions
both streams into rows of one shape — which stream (``INPUT``: 1 or 2), the key fields
under shared names (``key_column(i)``), each stream's fields under its own prefix
(``field_column(n, f)``), the other stream's null — and :class:`CoProcessAdapter`, a
one-input :class:`~ember.functions.KeyedProcessFunction`, hands each row back to
``process_element1`` or ``process_element2`` as the record it was. State, timers and
the context are the keyed runtime's, shared by both inputs as in Flink.
"""

from __future__ import annotations

from typing import Any, Iterable

from ember.functions import Context, KeyedCoProcessFunction, KeyedProcessFunction, RuntimeContext

__all__ = ["CoProcessAdapter", "INPUT", "key_column", "field_column"]

INPUT = "__ember_input"


def key_column(i: int) -> str:
    return f"__ember_key{i}"


def field_column(stream: int, field: str) -> str:
    return f"__ember_{stream}_{field}"


class CoProcessAdapter(KeyedProcessFunction):
    """``fn``'s two inputs as one: a row of stream 1 or 2 becomes its record again."""

    def __init__(self, fn: KeyedCoProcessFunction, fields1: list[str], fields2: list[str]) -> None:
        self.fn = fn
        self.columns = (
            [(f, field_column(1, f)) for f in fields1],
            [(f, field_column(2, f)) for f in fields2],
        )

    def open(self, ctx: RuntimeContext) -> None:
        self.fn.open(ctx)

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        if value[INPUT] == 1:
            return self.fn.process_element1({f: value[c] for f, c in self.columns[0]}, ctx)
        return self.fn.process_element2({f: value[c] for f, c in self.columns[1]}, ctx)

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        return self.fn.on_timer(timestamp, ctx)

    @property
    def user_name(self) -> str:
        return type(self.fn).__name__

    def failed_call(self, value: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
        """The method a failed row went to, and its record (the keyed runtime's errors and
        dead letters name these)."""
        stream = 1 if value[INPUT] == 1 else 2
        return (f"{self.user_name}.process_element{stream}",
                {f: value[c] for f, c in self.columns[stream - 1]}, True)
