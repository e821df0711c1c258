"""Typed contracts between the keyed runtime, Spark and the operators it runs.

- :class:`GroupState`: the part of Spark's ``GroupState`` (``applyInPandasWithState``)
  a bucket function uses — the bucket's pickled state and its timeout.
- :class:`BatchHandler`: an operator that may take a whole micro-batch of a bucket
  at once (Ember's window operator) instead of one ``process_element`` call per record.
- :func:`failed_call` / :func:`user_name`: what an adapter (two inputs as one: co-process,
  broadcast) tells the runtime about a failed call, so errors and dead letters name the
  user's method and carry the record as the user's function saw it.

(The runtime an operator receives is :class:`~ember.runner.spark.keyed.runtime.KeyedRuntime`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ember.runner.spark.keyed.runtime import KeyedRuntime

__all__ = ["GroupState", "BatchHandler", "RecordsBuilder", "failed_call", "user_name"]

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
    True — or returns False to have the runtime call ``process_element`` per record.
    An operator with ``whole_batch = True`` gets a bucket's records of the batch in one call
    (else one call per Arrow frame, each sorted apart)."""

    def process_batch(self, rt: KeyedRuntime, build: RecordsBuilder, keys: list[Any], columns: list[list[Any]],
                      times: list[int] | None, out: list[Any]) -> bool: ...


def user_name(fn: Any) -> str:
    """The class name of the user's function behind ``fn`` (an adapter's ``user_name``)."""
    return str(getattr(fn, "user_name", type(fn).__name__))


def failed_call(fn: Any, record: Any) -> tuple[str, Any, bool]:
    """What a ``fn.process_element(record)`` that raised was: the user's method
    (``Class.method``), the record as that method saw it, and whether the failure is reported
    (an adapter's ``failed_call``: of a broadcast record's copies, one is)."""
    describe = getattr(fn, "failed_call", None)
    if describe is None:
        return f"{type(fn).__name__}.process_element", record, True
    what, seen, reported = describe(record)
    return str(what), seen, bool(reported)
