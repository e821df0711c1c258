"""Bulk transfer into a keyed operator: rows packed per state bucket.

Spark's ``applyInPandasWithState`` costs about a microsecond per input row on
the JVM side (row to Arrow conversion, sorting the grouped rows, per-row
bookkeeping), measured at ~2 s per 2 M rows with a function that does nothing —
the floor under every keyed step. Before the shuffle, each partition therefore
packs its rows into one Arrow IPC stream per state bucket (``mapInArrow``); the
shuffle and the stateful operator then see one row per bucket and partition,
and the bucket function unpacks them into one pandas DataFrame with zero-copy
Arrow reads. docs/design/keyed-state.md has the measurements.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from ember.connectors.hashing import spark_xxhash64

__all__ = ["PACKED_ROWS", "PackSpec", "packer", "pack_at_source", "unpacking"]

PACKED_ROWS = "__ember_rows"


@dataclass(frozen=True)
class PackSpec:
    """How a Python source packs its own rows for the keyed step right after it
    (source fusion): the key fields and their Spark types, the number of state
    buckets, and the event-time field (epoch ms), whose values also go into
    each record as ``time_column``. JSON-able, to travel in a source option."""

    keys: tuple[str, ...]
    key_kinds: tuple[str, ...]
    buckets: int
    bucket_column: str
    time_field: str | None = None
    time_column: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "PackSpec":
        fields: dict[str, Any] = json.loads(text)
        kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        return cls(**kwargs)


def _packed(batches: Iterator[tuple[pa.RecordBatch, np.ndarray]], bucket: str,
            time_field: str | None = None) -> Iterator[pa.RecordBatch]:
    """One ``(bucket, Arrow IPC stream[, max of time_field])`` row per bucket of the
    ``(records, their buckets)`` in ``batches``; row order within a bucket is kept."""
    parts: dict[int, list[pa.RecordBatch]] = {}
    latest: dict[int, int] = {}
    schema = None
    for batch, b in batches:
        if batch.num_rows == 0:
            continue
        order = np.argsort(b, kind="stable")
        data = batch.take(pa.array(order))
        schema = data.schema
        sorted_b = b[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_b)) + 1]
        ends = np.r_[starts[1:], len(order)]
        if time_field is not None:
            maxima = np.maximum.reduceat(data.column(time_field).to_numpy(), starts)
            for key, value in zip(sorted_b[starts].tolist(), maxima.tolist()):
                latest[key] = max(latest.get(key, value), value)
        for key, start, end in zip(sorted_b[starts].tolist(), starts.tolist(), ends.tolist()):
            parts.setdefault(key, []).append(data.slice(start, end - start))
    if not parts:
        return
    blobs = []
    for slices in parts.values():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for s in slices:
                writer.write_batch(s)
        blobs.append(sink.getvalue().to_pybytes())
    columns = [pa.array(list(parts), pa.int32()), pa.array(blobs, pa.binary())]
    names = [bucket, PACKED_ROWS]
    if time_field is not None:
        columns.append(pa.array([latest[k] for k in parts], pa.int64()))
        names.append(time_field)
    yield pa.RecordBatch.from_arrays(columns, names=names)


def packer(bucket: str, drop: tuple[str, ...]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: a partition's rows -> ``(bucket, Arrow IPC stream)``
    per bucket, without the ``bucket`` and ``drop`` columns."""

    def split(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        records = batch.drop_columns([bucket, *[c for c in drop if c in batch.schema.names]])
        return records, batch.column(bucket).to_numpy(zero_copy_only=False)

    def pack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from _packed((split(b) for b in batches), bucket)

    return pack


def pack_at_source(batches: Iterator[pa.RecordBatch], spec: PackSpec) -> Iterator[pa.RecordBatch]:
    """A Python source's own record batches packed per state bucket, the bucket
    computed as Spark's ``pmod(xxhash64(keys), buckets)`` would; each record gets
    ``spec.time_column`` (its event time in ms), each packed row the latest event
    time of its records under the name of ``spec.time_field`` (for the watermark)."""

    def split(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        keys = [batch.column(k).to_numpy(zero_copy_only=False) for k in spec.keys]
        buckets = np.mod(spark_xxhash64(*keys, kinds=spec.key_kinds), spec.buckets)
        if spec.time_field is not None:
            batch = batch.append_column(spec.time_column, batch.column(spec.time_field).cast(pa.int64()))
        return batch, buckets

    yield from _packed((split(b) for b in batches), spec.bucket_column, spec.time_field)


BucketFunction = Callable[[Any, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]


def unpacking(run: BucketFunction) -> BucketFunction:
    """Wrap a bucket function so it receives the unpacked rows as one DataFrame."""

    def unpacked(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        tables = [pa.ipc.open_stream(blob).read_all() for pdf in frames for blob in pdf[PACKED_ROWS]]
        # An integer column with nulls stays Python ints and None (not floats and NaN): a
        # nullable field, or a two-input step's fields of the other input (translators/coprocess.py).
        rows = iter([pa.concat_tables(tables).to_pandas(integer_object_nulls=True)]) if tables else iter([])
        return run(key, rows, state)

    return unpacked
