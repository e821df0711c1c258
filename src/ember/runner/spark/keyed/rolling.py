"""Combining a rolling aggregation per key before the shuffle (``emit="batch"``).

A rolling ``sum``/``min``/``max`` that emits once per key and micro-batch needs, per key,
only the aggregate of the batch's values and the key's first record. Each partition
therefore folds its records into one *partial row* per key — the key's first record (in
event-time order, else arrival order) with the field replaced by the partition's aggregate
of it (nulls skipped; null when all are) — and the keyed step folds the partial rows with
the same rolling function as records: ``first record + p1 + p2`` is what ``first record +
every value`` would give, and the base record is the key's first. Only the partial rows
cross the shuffle and Spark's Python state operator (about one per key and partition
instead of one per record).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["rolling_combiner", "partial_schema"]

_INDEX = "__ember_row"


def rolling_combiner(kind: str, field: str, keys: tuple[str, ...], fields: list[str], schema: pa.Schema,
                     time_column: str | None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: a partition's records -> one partial row per key, with
    ``fields`` (and ``time_column``, the first record's event time, when given) in ``schema``."""
    columns = [*fields, *([time_column] if time_column else [])]

    def combine(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunks = [b.select(columns) for b in batches if b.num_rows]
        if not chunks:
            return
        table = pa.Table.from_batches(chunks)
        if time_column is not None:  # a key's first record is its earliest (stable: ties keep arrival order)
            table = table.take(pc.sort_indices(table, [(time_column, "ascending")]))  # pyarrow's sort is stable
        table = table.append_column(_INDEX, pa.array(range(table.num_rows), pa.int64()))
        grouped = table.group_by(list(keys), use_threads=False).aggregate([(_INDEX, "min"), (field, kind)])
        firsts = table.take(grouped.column(f"{_INDEX}_min"))
        total = grouped.column(f"{field}_{kind}").cast(schema.field(field).type)
        out = firsts.set_column(firsts.schema.get_field_index(field), field, total).select(columns)
        yield from out.cast(schema).to_batches()

    return combine


def partial_schema(fields: list[str], input_schema: Any, time_column: str | None) -> Any:
    """The Spark type of the partial rows: the records' fields (nullable) and the event time (ms)."""
    from pyspark.sql import types as T

    struct = T.StructType([T.StructField(f, input_schema[f].dataType, True) for f in fields])
    return struct.add(time_column, T.LongType(), True) if time_column is not None else struct
