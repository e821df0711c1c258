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
    """A declaration of where results go. Sinks may keep driver-side results (collect, count)."""

    def describe(self) -> str:
        return type(self).__name__
