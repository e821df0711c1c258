"""What Ember's window operator needs from a window step's declaration:
its default trigger, its output schema, and built-in aggregates as an
``AggregateFunction`` (for windows Spark's native aggregation cannot run)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T

from ember.errors import PipelineError
from ember.functions import AggregateFunction
from ember.graph.nodes import WindowNode
from ember.runner.spark.translators.python_ops import output_struct
from ember.windowing.aggregates import Aggregate
from ember.windowing.assigners import WindowAssigner
from ember.windowing.triggers import EventTimeTrigger, NeverTrigger, ProcessingTimeTrigger, Trigger

__all__ = ["default_trigger", "window_output", "builtin_aggregate", "BuiltinAggregates"]

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def default_trigger(assigner: WindowAssigner) -> Trigger:
    if assigner.is_global:
        return NeverTrigger()
    return ProcessingTimeTrigger() if assigner.processing_time else EventTimeTrigger()


class BuiltinAggregates(AggregateFunction):
    """Ember's built-in aggregates (count, sum, min, max, avg, first, last) as one
    AggregateFunction; the accumulator is a list with one entry per aggregate."""

    def __init__(self, aggregates: list[tuple[str, str, str | None]]) -> None:
        self.aggregates = aggregates  # (output name, kind, field)

    def create_accumulator(self) -> list[Any]:
        return [0 if kind == "count" else [0.0, 0] if kind == "avg" else None for _, kind, _ in self.aggregates]

    def add(self, value: dict[str, Any], acc: list[Any]) -> list[Any]:
        for i, (_, kind, field) in enumerate(self.aggregates):
            v = value[field] if field is not None else 1
            if kind == "count":
                acc[i] += v is not None
            elif v is None:
                continue
            elif kind == "avg":
                acc[i][0] += v
                acc[i][1] += 1
            elif kind == "first":
                if acc[i] is None:
                    acc[i] = v
            elif kind == "last" or acc[i] is None:
                acc[i] = v
            elif kind == "sum":
                acc[i] += v
            elif kind == "min":
                acc[i] = min(acc[i], v)
            elif kind == "max":
                acc[i] = max(acc[i], v)
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        out = []
        for (_, kind, _), x, y in zip(self.aggregates, a, b):
            if kind in ("count",):
                out.append(x + y)
            elif kind == "avg":
                out.append([x[0] + y[0], x[1] + y[1]])
            elif x is None or y is None:
                out.append(y if x is None else x)
            elif kind == "sum":
                out.append(x + y)
            elif kind == "min":
                out.append(min(x, y))
            elif kind == "max":
                out.append(max(x, y))
            else:  # first keeps a, last keeps b (a holds the earlier records)
                out.append(x if kind == "first" else y)
        return out

    def get_result(self, acc: list[Any]) -> dict[str, Any]:
        result = {}
        for (name, kind, _), v in zip(self.aggregates, acc):
            result[name] = (v[0] / v[1] if v[1] else None) if kind == "avg" else v
        return result


NUMERIC = (*_INTEGRAL, T.FloatType, T.DoubleType, T.DecimalType)


def check_aggregates(aggregates: tuple[tuple[str, Aggregate], ...], input_type: T.StructType, step: str) -> None:
    """Refuses, before the job starts, a built-in aggregate reading a field the stream lacks,
    or ``sum`` / ``avg`` of a field that is not a number (Spark would cast its values and fail
    on the first that is not one, mid-job)."""
    for out, agg in aggregates:
        if agg.field is None:
            continue
        if agg.field not in input_type.names:
            raise PipelineError(
                f"aggregate '{out}' reads field '{agg.field}', which is not in the stream (fields: {', '.join(input_type.names)})",
                step,
            )
        dtype = input_type[agg.field].dataType
        if agg.kind in ("sum", "avg") and not isinstance(dtype, NUMERIC):
            raise PipelineError(
                f"aggregate '{out}' is {agg.kind}('{agg.field}'), a field of type {dtype.simpleString()}; {agg.kind} takes a "
                f"number: cast it first (select(\"CAST({agg.field} AS BIGINT) AS {agg.field}\")) or count it", step,
            )


def builtin_aggregate(aggregates: tuple[tuple[str, Aggregate], ...], input_type: T.StructType, step: str) -> BuiltinAggregates:
    check_aggregates(aggregates, input_type, step)
    return BuiltinAggregates([(out, agg.kind, agg.field) for out, agg in aggregates])


def _aggregate_type(kind: str, field: str | None, input_type: T.StructType) -> T.DataType:
    if kind == "count":
        return T.LongType()
    if kind == "avg":
        return T.DoubleType()
    assert field is not None  # every aggregate but count reads a field (Aggregate checks it)
    dtype = input_type[field].dataType
    if kind == "sum":
        return T.LongType() if isinstance(dtype, _INTEGRAL) else T.DoubleType()
    return dtype


def window_output(node: WindowNode, input_type: T.StructType, aggregate: Any) -> tuple[T.StructType, tuple[str, ...]]:
    """The step's output schema, and the names of an aggregate result's fields."""
    if node.window_fn is not None:
        return output_struct(node.output_schema, None, node.name), ()
    if aggregate is None:  # reduce: the reduced record and its window
        taken = [f for f in ("window_start", "window_end") if f in input_type.names]
        if taken:
            raise PipelineError(
                f"reduce emits the reduced record with window_start and window_end, but the stream already has {taken}: "
                "rename them with select before the window", node.name,
            )
        window = [T.StructField("window_start", T.LongType()), T.StructField("window_end", T.LongType())]
        return T.StructType(list(input_type.fields) + window), ()
    if isinstance(aggregate, BuiltinAggregates):
        result = T.StructType([T.StructField(o, _aggregate_type(k, f, input_type)) for o, k, f in aggregate.aggregates])
    else:
        result = output_struct(node.output_schema, None, node.name)
    out = T.StructType(
        [input_type[k] for k in node.keys]
        + [T.StructField("window_start", T.LongType()), T.StructField("window_end", T.LongType())]
    )
    clash = [f.name for f in result.fields if f.name in out.names]
    if clash:
        raise PipelineError(
            f"the aggregate's output fields {clash} clash with the key / window fields ({', '.join(out.names)})", node.name
        )
    for f in result.fields:
        out = out.add(f)
    return out, tuple(result.names)
