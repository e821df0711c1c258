"""Source and sink base declarations shared by every connector."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Source", "Sink"]


@dataclass(frozen=True)
class Source:
    """A declaration of where records come from. The Spark runner translates it."""

    @property
    def bounded(self) -> bool:
        """True when the source ends by itself."""
        return False

    @property
    def schema_ddl(self) -> str | None:
        """Spark DDL of the records, when known without Spark."""
        return None

    def describe(self) -> str:
        return type(self).__name__


class Sink:
    """A declaration of where results go. Sinks may keep driver-side results (collect, count).

    The runner's contract with a sink that keeps results on the driver: it hands
    each micro-batch's output to ``accept_batch`` (the sink's own signature), and
    when the job stops it calls :meth:`forget_after` with the last batch the job
    counted, so output of a batch Spark did not commit is dropped."""

    def describe(self) -> str:
        return type(self).__name__

    def forget_after(self, batch_id: int) -> None:  # noqa: B027 - a no-op for sinks that keep nothing
        """Drop output kept for batches after ``batch_id``."""
