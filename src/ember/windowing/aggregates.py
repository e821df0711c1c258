"""Built-in window aggregates. They compile to Spark's native aggregate functions."""

from __future__ import annotations

from dataclasses import dataclass

from ember.errors import ConfigError

__all__ = ["Agg", "Aggregate", "AGGREGATE_KINDS"]

AGGREGATE_KINDS = ("count", "sum", "min", "max", "avg", "first", "last")


@dataclass(frozen=True)
class Aggregate:
    """One output column of a window: ``kind`` over ``field`` (``count`` needs no field)."""

    kind: str
    field: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in AGGREGATE_KINDS:
            raise ConfigError(
                f"unknown aggregate {self.kind!r}; valid: {', '.join(AGGREGATE_KINDS)}"
            )
        if self.kind != "count" and not (isinstance(self.field, str) and self.field):
            raise ConfigError(f"aggregate {self.kind!r} needs a field name, got {self.field!r}")

    def default_name(self) -> str:
        return "count" if self.field is None else f"{self.kind}_{self.field}"

    def describe(self) -> str:
        return f"{self.kind}({self.field or '*'})"


class Agg:
    """Factories: ``Agg.count()``, ``Agg.sum("price")``, ``Agg.first("ad_id")``..."""

    @staticmethod
    def count(field: str | None = None) -> Aggregate:
        return Aggregate("count", field)

    @staticmethod
    def sum(field: str) -> Aggregate:
        return Aggregate("sum", field)

    @staticmethod
    def min(field: str) -> Aggregate:
        return Aggregate("min", field)

    @staticmethod
    def max(field: str) -> Aggregate:
        return Aggregate("max", field)

    @staticmethod
    def avg(field: str) -> Aggregate:
        return Aggregate("avg", field)

    @staticmethod
    def first(field: str) -> Aggregate:
        return Aggregate("first", field)

    @staticmethod
    def last(field: str) -> Aggregate:
        return Aggregate("last", field)
