"""SQL steps: a Spark SQL query over streams registered as views.

Each view is the stream's DataFrame as a Spark temporary view, with the stream's event time
(when it has one) as a ``timestamp`` column watermarked with the stream's bound — what Spark
SQL's ``window(...)``, stream-stream joins and aggregations need. The query is analysed
right here, so a mistake in it fails before the job starts, naming the step. Spark's own
streaming rules apply inside the query (docs/sql.md).
"""

from __future__ import annotations

from typing import Any

from ember.errors import PipelineError
from ember.graph.nodes import SqlNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.translators.eventtime import HIDDEN, with_event_time
from ember.time.watermarks import TimeCharacteristic

__all__: list[str] = []


@translates(SqlNode)
def _sql(comp: Compilation, node: SqlNode) -> Frame:
    for view, parent in zip(node.views, node.inputs):
        up = comp.frame(parent)
        df = up.df.drop(*[c for c in up.df.columns if c in HIDDEN])
        if node.rowtime in df.columns:
            raise PipelineError(
                f"the view '{view}' has a field '{node.rowtime}' already; pass env.sql(..., rowtime='another_name')",
                node.name,
            )
        if up.time is not None and up.time.characteristic is TimeCharacteristic.EVENT_TIME:
            df = with_event_time(comp, df, up.time, node.name, column=node.rowtime)
        df.createOrReplaceTempView(view)
    try:
        result: Any = comp.spark.sql(node.query)
    except Exception as exc:  # Spark's parse and analysis errors: the query's own mistakes
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PipelineError(f"Spark SQL refused the query: {message}", node.name) from None
    if not result.isStreaming:
        raise PipelineError("the query reads no stream (a SQL step must read at least one view)", node.name)
    return Frame(result)
