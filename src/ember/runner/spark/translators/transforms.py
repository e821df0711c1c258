"""Native (JVM-only) transforms: select, SQL/Column filter, union, lookup join, key_by."""

from __future__ import annotations

import re
from typing import Any

from pyspark.sql import functions as F

from ember.errors import PipelineError
from ember.graph.nodes import FilterNode, KeyByNode, LookupJoinNode, SelectNode, UnionNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.keyed.runtime import ANCHOR, HIDDEN, PRE, TIME_OUT, without_hidden
from ember.runner.spark.translators.decoding import spooled_letters, unmatched_reason
from ember.runner.spark.translators.eventtime import own_watermark
from ember.runner.spark.translators.python_ops import python_filter

__all__ = ["column", "key_columns", "check_paired_keys", "lane_lookup", "lane_select"]


def column(expr: Any) -> Any:
    """A Spark Column from a SQL string or a Column."""
    return F.expr(expr) if isinstance(expr, str) else expr


def key_columns(keys: tuple[Any, ...]) -> list[Any]:
    return [F.col(k) if isinstance(k, str) else k for k in keys]


def check_paired_keys(step: str, first: tuple[str, Any, tuple[str, ...]], second: tuple[str, Any, tuple[str, ...]]) -> None:
    """Two streams keyed for one two-input step (a join, a co-process function): each
    ``(label, record struct, key fields)``; every key field exists and the paired ones
    (in order) have the same type."""
    for label, struct, keys in (first, second):
        for key in keys:
            if key not in struct.names:
                raise PipelineError(
                    f"key field '{key}' is not in the {label} stream (fields: {', '.join(struct.names)})", step
                )
    for k1, k2 in zip(first[2], second[2]):
        t1, t2 = first[1][k1].dataType, second[1][k2].dataType
        if t1 != t2:
            raise PipelineError(
                f"key fields '{k1}' ({t1.simpleString()}) and '{k2}' ({t2.simpleString()}) differ in type; "
                "cast one side first (select)", step,
            )


def key_name(key: Any) -> str:
    """The output name of a key: the field name, or a Column's SQL text."""
    if isinstance(key, str):
        return key
    text = str(key)
    match = re.fullmatch(r"Column<'(.*)'>", text, flags=re.S)
    return match.group(1) if match else text


@translates(SelectNode)
def _select(comp: Compilation, node: SelectNode) -> Frame:
    """A projection. On a keyed step's rows read by another keyed step, each output row keeps
    its input row's hidden event-time columns (Flink's map keeps the record's timestamp)."""
    up = comp.frame(node.inputs[0])
    exprs = [column(e) for e in node.exprs]
    df = up.df.select(*exprs)
    carried = [c for c in up.df.columns if c in HIDDEN and c not in df.columns]  # ("*" selects them itself)
    return Frame(up.df.select(*exprs, *carried) if carried else df, up.time)


def lane_select(df: Any, node: SelectNode, lane: tuple[str, int, list[str]], prefix: str) -> tuple[Any, list[str]]:
    """``node`` (a select) on the rows of one lane of a fan-out only (translators/fanout.py),
    as python_ops.lane_map does a map: its output fields in columns ``prefix + field`` on that
    lane's rows (null on the others'), beside the row's columns (its event time among them).
    ``lane``: ``(lane column, the lane, the records' fields)``. Returns the frame and the
    output's fields."""
    column_name, lane_id, visible = lane
    exprs = [column(e) for e in node.exprs]
    names = df.select(*[F.col(f) for f in visible]).select(*exprs).columns  # (analysed on the records' fields)
    if len(names) != len(exprs):
        raise PipelineError(
            f"'{node.name}' selects '*' on one branch of a fan-out; name its fields there (or select before the "
            "branches part)", node.name,
        )
    mine = F.col(column_name) == F.lit(lane_id)
    return df.select("*", *[F.when(mine, e).alias(prefix + n) for n, e in zip(names, exprs)]), names


@translates(FilterNode)
def _filter(comp: Compilation, node: FilterNode) -> Frame:
    up = comp.frame(node.inputs[0])
    if node.is_python:
        return Frame(python_filter(comp, up.df, node), up.time)
    return Frame(up.df.filter(column(node.predicate)), up.time)


@translates(UnionNode)
def _union(comp: Compilation, node: UnionNode) -> Frame:
    frames = [comp.frame(n) for n in node.inputs]
    times = {f.time for f in frames}
    if len(times) > 1:
        described = "; ".join(f"{n.name}: {f.time.describe() if f.time else 'no watermark'}" for n, f in zip(node.inputs, frames))
        raise PipelineError(f"union inputs must share one watermark strategy ({described})", node.name)
    first = frames[0]
    fields = sorted(without_hidden(first.df.schema).names)
    for other, parent in zip(frames[1:], node.inputs[1:]):
        theirs = sorted(without_hidden(other.df.schema).names)
        if fields != theirs:
            raise PipelineError(
                f"union inputs must have the same fields: {fields} vs {theirs} (from '{parent.name}')", node.name)
    frames = _timed_like_steps(comp, node, frames)
    df = frames[0].df
    for other in frames[1:]:
        df = df.unionByName(other.df)
    return Frame(df, first.time)


def _timed_like_steps(comp: Compilation, node: UnionNode, frames: list[Frame]) -> list[Frame]:
    """When some inputs are a keyed step's rows read by another keyed step (each row's event
    time in hidden columns, docs/design/dataflow.md), the other inputs' rows get the same:
    their event time (TIME, their watermark set here, as on a two-input step's input from
    a source), PRE false (none was emitted ahead of an upstream watermark) and the null
    watermark anchor. Otherwise the frames as they are."""
    stepped = next((f.df.columns for f in frames if TIME_OUT in f.df.columns), None)
    if stepped is None:
        return frames
    anchored = any(ANCHOR in f.df.columns for f in frames)
    out = []
    for i, frame in enumerate(frames):
        if TIME_OUT in frame.df.columns:
            if anchored and ANCHOR not in frame.df.columns:  # a SQL step's rows (translators/sql.py) beside a keyed step's
                frame = Frame(frame.df.select("*", F.lit(None).cast("timestamp").alias(ANCHOR)), frame.time)
            out.append(frame)
            continue
        assert frame.time is not None  # the union's inputs share the stepped input's watermark strategy
        df, own_time = own_watermark(comp, frame.df, frame.time, node.name, f"__ember_watermark_of_input_{i}")
        columns = [F.col(c) for c in frame.df.columns] + [own_time, F.lit(False).alias(PRE)]
        if anchored:
            columns.append(F.lit(None).cast("timestamp").alias(ANCHOR))
        out.append(Frame(df.select(*columns), frame.time))
    return out


def _checked_table(comp: Compilation, node: LookupJoinNode, fields: list[str]) -> Any:
    """``node``'s lookup table, checked against the stream's ``fields``: both have the join
    fields, and no other field of the same name."""
    table = _static_table(comp, node)
    for key in node.on:
        if key not in fields:
            raise PipelineError(f"join field '{key}' is not in the stream (fields: {', '.join(fields)})", node.name)
        if key not in table.columns:
            raise PipelineError(f"join field '{key}' is not in the lookup table (fields: {', '.join(table.columns)})", node.name)
    clash = (set(fields) & set(table.columns)) - set(node.on)
    if clash:
        raise PipelineError(f"stream and lookup table both have fields {sorted(clash)}; rename one side", node.name)
    return table


@translates(LookupJoinNode)
def _lookup_join(comp: Compilation, node: LookupJoinNode) -> Frame:
    up = comp.frame(node.inputs[0])
    table = _checked_table(comp, node, list(up.df.columns))
    if node.unmatched is not None:
        from ember.runner.spark.translators.decoding import lookup_with_unmatched

        return Frame(lookup_with_unmatched(comp, node, up.df, table), up.time)
    return Frame(up.df.join(F.broadcast(table), list(node.on), node.how), up.time)


def lane_lookup(comp: Compilation, df: Any, node: LookupJoinNode, lane: tuple[str, int, list[str]],
                prefix: str, spool: str | None = None) -> tuple[Any, list[str]]:
    """``node`` (a ``join_lookup``) on the rows of one lane of a fan-out only
    (translators/fanout.py), as python_ops.lane_map does a map: a lane's row joins the table's
    rows of its key (one output row each; none, with ``how="inner"``, when no row matches — with
    ``unmatched``, it is a dead letter, spooled to ``spool``), the record's and the table's
    fields in columns ``prefix + field`` beside the row's columns (its event time among them);
    the other lanes' rows pass once each, those columns null. ``lane``: ``(lane column, the
    lane, the records' fields)``. Returns the frame and the output's fields (the join fields,
    the record's others, the table's others: Spark's order)."""
    column_name, lane_id, visible = lane
    table = _checked_table(comp, node, visible)
    extra = [c for c in table.columns if c not in node.on]
    right = table.select(*[F.col(k).alias(f"{prefix}on_{k}") for k in node.on],
                         *[F.col(c).alias(prefix + c) for c in extra], F.lit(True).alias(f"{prefix}matched"))
    mine = F.col(column_name) == F.lit(lane_id)
    condition = mine
    for key in node.on:
        condition = condition & (F.col(key) == F.col(f"{prefix}on_{key}"))
    joined = df.join(F.broadcast(right), condition, "left")  # (another lane's row matches nothing: it passes once)
    missing = mine & F.col(f"{prefix}matched").isNull()
    if node.unmatched is None and node.how == "inner":
        joined = joined.filter(~missing)
    names = [*node.on, *(f for f in visible if f not in node.on), *extra]
    own = [F.when(mine, F.col(f)).alias(prefix + f) for f in visible]
    out = [F.col(c) for c in df.columns] + own + [F.col(prefix + c) for c in extra]
    if node.unmatched is None:
        return joined.select(*out), names
    if spool is None:  # (the planner detours a lane step's dead letters: not reached)
        raise PipelineError("its unmatched records have no detour on this lane's path", node.name)
    raw, why = f"{prefix}letter_raw", f"{prefix}letter_error"
    letters = [F.when(missing, F.to_json(F.struct(*[F.col(f) for f in visible]))).alias(raw),
               F.when(missing, unmatched_reason(node)).alias(why)]
    tagged = joined.select(*out, *letters)
    return spooled_letters(tagged, raw, why, spool, [c for c in tagged.columns if c not in (raw, why)]), names


def _static_table(comp: Compilation, node: LookupJoinNode) -> Any:
    table = node.table
    if type(table).__name__ == "DataFrame" and hasattr(table, "sparkSession"):
        return table
    try:
        import pandas as pd

        if isinstance(table, pd.DataFrame):
            return comp.spark.createDataFrame(table)
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    if isinstance(table, list) and table and all(isinstance(r, dict) for r in table):
        return comp.spark.createDataFrame(table)
    raise PipelineError(
        f"lookup table must be a pandas DataFrame, a Spark DataFrame or a non-empty list of dicts, got {type(table).__name__}",
        node.name,
    )


@translates(KeyByNode)
def _key_by(comp: Compilation, node: KeyByNode) -> Frame:
    up = comp.frame(node.inputs[0])
    return Frame(up.df.repartition(comp.parallelism, *key_columns(node.keys)), up.time)
