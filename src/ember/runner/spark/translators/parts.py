"""Parts of a job that run beside the rest of it in the one streaming query.

A job splits after its last shared step and runs the steps after the split per micro-batch,
where only stateless steps can run. Two kinds of part do not fit that shape:

- a SQL step reading sources (through stateless steps) that only some sinks read
  (placement.sql_branches): it would come after the split, but its query (windowed
  aggregations, joins) keeps state in Spark;
- a pipeline unrelated to the rest (planner.Beside: its own sources, steps and sinks): it
  shares no step the job could split at (its stateful steps, if any, come before its own split).

So each part runs *beside* the rest of the job in the one streaming query: its rows and the
rest's are unioned, each row tagged with its part (:data:`PART`: 0 the rest, ``k`` the
``k``-th part), the query's output ends there, and at the split each part's rows go back to
their own columns, to be written to the part's sinks like a split's branches. Spark reads a
source two parts read once per part in each micro-batch, at the same offsets; its stateful
operators are numbered the rest's first, then the SQL branches', then the unrelated pipelines',
in union order (restart.pipeline_manifest, restart.spark_operator_ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F

from ember.graph.nodes import Node
from ember.time.watermarks import WatermarkStrategy

__all__ = ["PART", "Parts"]

PART = "__ember_part"


def _column(k: int, name: str) -> str:
    return f"__ember_part{k}_{name}"


@dataclass(frozen=True)
class Parts:
    """The union of the rest of the job's rows (``main``: its columns, or None when every sink
    reads a part) and the parts' (``branches``: each part's step — a SQL step, or where an
    unrelated pipeline's sinks split — its columns and its stream's time)."""

    main: tuple[str, ...] | None
    branches: tuple[tuple[Node, tuple[str, ...], WatermarkStrategy | None], ...]

    @staticmethod
    def union(main: Any | None, branches: list[tuple[Node, Any, WatermarkStrategy | None]]) -> tuple["Parts", Any]:
        """The parts and their union, one streaming DataFrame (``main``: the rest's rows, or None;
        ``branches``: each part's step, its rows and their time)."""
        frames = [] if main is None else [main.withColumn(PART, F.lit(0))]
        for k, (_, df, _) in enumerate(branches, start=1):
            frames.append(df.select(*[F.col(f"`{c}`").alias(_column(k, c)) for c in df.columns], F.lit(k).alias(PART)))
        out = frames[0]
        for df in frames[1:]:
            out = out.unionByName(df, allowMissingColumns=True)
        parts = Parts(None if main is None else tuple(main.columns),
                      tuple((node, tuple(df.columns), time) for node, df, time in branches))
        return parts, out

    def split(self, batch: Any) -> tuple[Any | None, list[tuple[Node, Any, WatermarkStrategy | None]]]:
        """One micro-batch of the union: the rest's rows (None without a rest) and each part's,
        under their own columns, with their time."""
        main = None
        if self.main is not None:
            main = batch.filter(F.col(PART) == F.lit(0)).select(*[F.col(f"`{c}`") for c in self.main])
        rows = [(node, batch.filter(F.col(PART) == F.lit(k)).select(*[F.col(_column(k, c)).alias(c) for c in columns]), time)
                for k, (node, columns, time) in enumerate(self.branches, start=1)]
        return main, rows
