"""Typed contracts between the keyed runtime, Spark and the operators it runs.

- :class:`GroupState`: the part of Spark's ``GroupState`` (``applyInPandasWithState``)
  a bucket function uses — the bucket's pickled state and its timeout.
- :class:`BatchHandler`: an operator that may take a whole micro-batch of a bucket
  at once (Ember's window operator) instead of one ``process_element`` call per record.

(The runtime an operator receives is :class:`~ember.runner.spark.keyed.runtime.KeyedRuntime`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ember.runner.spark.keyed.runtime import KeyedRuntime

__all__ = ["GroupState", "BatchHandler", "RecordsBuilder"]

# Columns (one list per field) -> one record dict per row (runtime.records_builder).
RecordsBuilder = Callable[[list[list[Any]]], list[dict[str, Any]]]


class GroupState(Protocol):
    """Spark's per-group state handle, as far as Ember's bucket functions use it."""

    @property
    def exists(self) -> bool: ...

    @property
    def get(self) -> tuple[Any, ...]: ...

    def update(self, value: tuple[Any, ...]) -> None: ...

    def getCurrentWatermarkMs(self) -> int: ...  # noqa: N802 - Spark's names

    def getCurrentProcessingTimeMs(self) -> int: ...  # noqa: N802

    def setTimeoutTimestamp(self, timestamp_ms: int) -> None: ...  # noqa: N802

    def setTimeoutDuration(self, duration_ms: int) -> None: ...  # noqa: N802


@runtime_checkable
class BatchHandler(Protocol):
    """An operator that processes a bucket's micro-batch itself.

    ``process_batch`` gets the runtime, the record builder, each record's key, the
    columns (one list per field) and, with event time, each record's timestamp (ms;
    the records sorted by it); it appends output records to ``out`` and returns
    True — or returns False to have the runtime call ``process_element`` per record."""

    def process_batch(self, rt: KeyedRuntime, build: RecordsBuilder, keys: list[Any], columns: list[list[Any]],
                      times: list[int] | None, out: list[Any]) -> bool: ...
