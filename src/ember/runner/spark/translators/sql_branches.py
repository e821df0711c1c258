"""SQL steps on branches of their own, beside the rest of a job with several sinks.

A job splits after its last shared step and runs the steps after the split per micro-batch,
where only stateless steps can run. A SQL step reading sources (through stateless steps) that
only some sinks read (placement.sql_branches) would be such a step — but its query (windowed
aggregations, joins) keeps state in Spark. So the query runs *beside* the rest of the job in
the one streaming query: its rows and the rest's are unioned, each row tagged with its part
(:data:`PART`: 0 the rest, ``k`` the ``k``-th SQL branch), the query's output ends there, and at
the split each part's rows go back to their own columns. Spark reads a source both parts read
once per part in each micro-batch, at the same offsets; its stateful operators are numbered
the rest's first, then the branches' in order (restart.spark_operator_ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F

from ember.graph.nodes import Node

__all__ = ["PART", "SqlParts"]

PART = "__ember_part"


def _column(k: int, name: str) -> str:
    return f"__ember_part{k}_{name}"


@dataclass(frozen=True)
class SqlParts:
    """The union of the rest of the job's rows (``main``: its columns, or None when every sink
    reads a SQL branch) and the SQL branches' (``branches``: each step and its columns)."""

    main: tuple[str, ...] | None
    branches: tuple[tuple[Node, tuple[str, ...]], ...]

    @staticmethod
    def union(main: Any | None, branches: list[tuple[Node, Any]]) -> tuple["SqlParts", Any]:
        """The parts and their union, one streaming DataFrame (``main``: the rest's rows, or None;
        ``branches``: each SQL step's rows)."""
        frames = [] if main is None else [main.withColumn(PART, F.lit(0))]
        for k, (_, df) in enumerate(branches, start=1):
            frames.append(df.select(*[F.col(f"`{c}`").alias(_column(k, c)) for c in df.columns], F.lit(k).alias(PART)))
        out = frames[0]
        for df in frames[1:]:
            out = out.unionByName(df, allowMissingColumns=True)
        parts = SqlParts(None if main is None else tuple(main.columns), tuple((node, tuple(df.columns)) for node, df in branches))
        return parts, out

    def split(self, batch: Any) -> tuple[Any | None, list[tuple[Node, Any]]]:
        """One micro-batch of the union: the rest's rows (None without a rest) and each SQL
        step's, under their own columns."""
        main = None
        if self.main is not None:
            main = batch.filter(F.col(PART) == F.lit(0)).select(*[F.col(f"`{c}`") for c in self.main])
        rows = [(node, batch.filter(F.col(PART) == F.lit(k)).select(*[F.col(_column(k, c)).alias(c) for c in columns]))
                for k, (node, columns) in enumerate(self.branches, start=1)]
        return main, rows
