"""SQL steps: a Spark SQL query over streams registered as views.

Each view is the stream's DataFrame as a Spark temporary view, with the stream's event time
(when it has one) as a ``timestamp`` column watermarked with the stream's bound — what Spark
SQL's ``window(...)``, stream-stream joins and aggregations need. A view of a keyed step's
output (its rows carry their event time in ms: the step emits it because a SQL step reads it,
``Plan.read_by_step``) takes ``rowtime`` from that time — a window's results their window's
end - 1, a process function's output its input's timestamp, as in Flink — and no watermark of
its own: Spark's watermark is the query's one, set on its sources before the keyed step; the
column only carries Spark's marker of an event-time column, as the keyed steps' anchor does.
The query is analysed
right here, so a mistake in it fails before the job starts, naming the step. Spark's own
streaming rules apply inside the query (docs/sql.md).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from ember.errors import PipelineError
from ember.graph.graph import STATEFUL
from ember.graph.nodes import Node, SqlNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.keyed.runtime import PRE
from ember.runner.spark.translators.eventtime import DELAY_KEY, HIDDEN, TIME, with_event_time
from ember.time.watermarks import TimeCharacteristic

__all__: list[str] = []

BARRIER_METRIC = "ember_watermark_barrier:"  # an observed metric no filter is pushed through (eventtime.py)


@translates(SqlNode)
def _sql(comp: Compilation, node: SqlNode) -> Frame:
    for view, parent in zip(node.views, node.inputs):
        up = comp.frame(parent)
        df = up.df.drop(*[c for c in up.df.columns if c in HIDDEN])
        earlier = _sql_rows(parent)
        if earlier is not None:  # another SQL step's rows: its rowtime column, if it selects one
            if earlier.rowtime in df.columns:
                df = _rowtime_of_sql_rows(df, earlier, node)
            df.createOrReplaceTempView(view)
            continue
        if node.rowtime in df.columns:
            raise PipelineError(
                f"the view '{view}' has a field '{node.rowtime}' already; pass env.sql(..., rowtime='another_name')",
                node.name,
            )
        if TIME in up.df.columns:  # a keyed step's rows, each with its event time
            stamp = F.timestamp_millis(F.col(TIME)).alias(node.rowtime, metadata={DELAY_KEY: 0})
            df = up.df.select(*df.columns, stamp)
        elif up.time is not None and up.time.characteristic is TimeCharacteristic.EVENT_TIME:
            df = with_event_time(comp, df, up.time, node.name, column=node.rowtime,
                                 barrier=f"{BARRIER_METRIC}{node.name}:{view}")  # (the query's filters stay above it)
        df.createOrReplaceTempView(view)
    try:
        result: Any = comp.spark.sql(node.query)
    except Exception as exc:  # Spark's parse and analysis errors: the query's own mistakes
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PipelineError(f"Spark SQL refused the query: {message}", node.name) from None
    if not result.isStreaming:
        raise PipelineError("the query reads no stream (a SQL step must read at least one view)", node.name)
    comp.sql_operators[node.name] = stateful_operators(result._jdf.queryExecution().analyzed())
    times = [comp.frame(p).time for p in node.inputs]
    time = next((t for t in times if t is not None and t.characteristic is TimeCharacteristic.EVENT_TIME), None)
    if time is None or not comp.plan.read_by_step_after_sql(node):
        return Frame(result)
    return Frame(_timed_rows(result, node, comp.sql_operators[node.name] > 0), time)


def _sql_rows(node: Node) -> SqlNode | None:
    """The SQL step whose rows ``node`` passes on unchanged in their time (itself, or through
    one-input stateless steps), if any."""
    while not isinstance(node, SqlNode):
        if isinstance(node, STATEFUL) or len(node.inputs) != 1:
            return None
        node = node.inputs[0]
    return node


def _rowtime_of_sql_rows(df: Any, earlier: SqlNode, node: SqlNode) -> Any:
    """A view of the SQL step ``earlier``'s rows for the SQL step ``node``: the column
    ``earlier`` selected as its rows' event time becomes ``node``'s rowtime, marked as an
    event-time column (the query's watermark is Spark's, passed on by ``earlier``'s
    operators: Spark chains its own window aggregations so)."""
    field = df.schema[earlier.rowtime]
    if not _is_timestamp(field):
        raise PipelineError(
            f"the rows of the SQL step '{earlier.name}' have a column '{earlier.rowtime}' that is a "
            f"{field.dataType.simpleString()}, not a timestamp: it cannot be their event time", node.name,
        )
    others = [c for c in df.columns if c != earlier.rowtime]
    if node.rowtime in others:
        raise PipelineError(
            f"the rows of the SQL step '{earlier.name}' have a field '{node.rowtime}' besides their event time "
            f"'{earlier.rowtime}'; pass env.sql(..., rowtime='another_name')", node.name,
        )
    return df.select(*others, F.col(earlier.rowtime).alias(node.rowtime, metadata={DELAY_KEY: 0}))


def _is_timestamp(field: Any) -> bool:
    return field.dataType.simpleString() in ("timestamp", "timestamp_ntz")


def _timed_rows(result: Any, node: SqlNode, stateful: bool) -> Any:
    """The query's rows for a keyed step after it: each with its event time in ms (TIME) from
    the query's ``rowtime`` column, as a keyed step's rows carry theirs. A query with stateful
    operators emits rows once Spark's watermark lets it (a window's results, a join's pairs):
    they count as emitted ahead of the watermark (PRE), so the keyed step judges them by the
    previous batch's, as it does a keyed step's timer output; a stateless query's rows are the
    records of the batch, judged by its own."""
    field = next((f for f in result.schema.fields if f.name == node.rowtime), None)
    if field is None or not _is_timestamp(field):
        found = f"a {field.dataType.simpleString()}" if field is not None else "none"
        raise PipelineError(
            f"a keyed step reads this SQL step's rows, so the query must select each row's event time as a timestamp "
            f"column '{node.rowtime}' (found {found}; e.g. window.end - INTERVAL 1 MILLISECOND AS {node.rowtime} for a "
            "window's results, Flink's timestamp for them)", node.name,
        )
    return result.select("*", F.unix_millis(F.col(node.rowtime)).alias(TIME), F.lit(stateful).alias(PRE))


# Logical operators Spark runs as stateful operators on a stream (each one operator id).
_STATEFUL_NODES = ("Aggregate", "Distinct", "Deduplicate", "DeduplicateWithinWatermark", "GlobalLimit")


def stateful_operators(plan: Any) -> int:
    """How many stateful operators Spark plans for the query's analysed ``plan`` (a JVM
    ``LogicalPlan``): streaming aggregations, distincts, deduplications, limits and
    stream-stream joins — not what the views it reads hold (Ember's steps before it, each
    numbered apart: restart.spark_operator_ids)."""
    name = plan.nodeName()
    if name == "View":
        return 0
    children = []
    it = plan.children().iterator()
    while it.hasNext():
        children.append(it.next())
    own = 0
    if plan.isStreaming():
        if name in _STATEFUL_NODES:
            own = 1
        elif name == "Join" and len(children) == 2 and all(c.isStreaming() for c in children):
            own = 1
    return own + sum(stateful_operators(c) for c in children)
