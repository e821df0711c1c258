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
import pyarrow.compute as pc

from ember.connectors.hashing import spark_xxhash64
from ember.runner.spark.keyed.reach import Reach

__all__ = ["PACKED_ROWS", "LATEST", "PackSpec", "packer", "pack_at_source", "unpacking"]

PACKED_ROWS = "__ember_rows"
LATEST = "__ember_latest"  # on a packed row: the latest event time (ms) among its partition's records


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
    every_bucket: bool = False  # a row for every bucket (the step's in-batch watermark, bucket.py)
    quiet_marks: str | None = None  # ... but the quiet ones (keyed/reach.py)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "PackSpec":
        fields: dict[str, Any] = json.loads(text)
        kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        return cls(**kwargs)


def _packed(batches: Iterator[tuple[pa.RecordBatch, np.ndarray]], bucket: str, time_field: str | None = None,
            latest: str | None = None, reach: Reach | None = None) -> Iterator[pa.RecordBatch]:
    """One ``(bucket, Arrow IPC stream)`` row per bucket of the ``(records, their buckets)``
    in ``batches``; row order within a bucket is kept.

    ``time_field``: the records' event time (ms); then every row also carries, as
    ``latest``, the latest event time of the partition's records (for Spark's watermark and
    the step's in-batch watermark, bucket.py). ``reach``: the buckets that must hear of
    that time (keyed/reach.py) — those without records get a row with an empty stream."""
    parts: dict[int, list[pa.RecordBatch]] = {}
    newest: int | None = None
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
            top = pc.max(data.column(time_field)).as_py()
            if top is not None and (newest is None or top > newest):
                newest = top
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
    ids = list(parts)
    if reach is not None and newest is not None:
        ids += [b for b in reach.targets() if b not in parts]
        blobs += [b""] * (len(ids) - len(blobs))
    columns = [pa.array(ids, pa.int32()), pa.array(blobs, pa.binary())]
    names = [bucket, PACKED_ROWS]
    if time_field is not None and latest is not None:
        columns.append(pa.array([newest] * len(ids), pa.int64()))
        names.append(latest)
    yield pa.RecordBatch.from_arrays(columns, names=names)


def packer(bucket: str, drop: tuple[str, ...], time_column: str | None = None,
           reach: Reach | None = None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: a partition's rows -> ``(bucket, Arrow IPC stream)``
    per bucket, without the ``bucket`` and ``drop`` columns. With ``time_column`` (event
    time in ms) each row also carries the partition's latest as ``LATEST``, and with
    ``reach`` the buckets it names get a row too (see :func:`_packed`)."""

    def split(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        records = batch.drop_columns([bucket, *[c for c in drop if c in batch.schema.names]])
        return records, batch.column(bucket).to_numpy(zero_copy_only=False)

    def pack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from _packed((split(b) for b in batches), bucket, time_column, LATEST if time_column else None, reach)

    return pack


def pack_at_source(batches: Iterator[pa.RecordBatch], spec: PackSpec) -> Iterator[pa.RecordBatch]:
    """A Python source's own record batches packed per state bucket, the bucket
    computed as Spark's ``pmod(xxhash64(keys), buckets)`` would; each record gets
    ``spec.time_column`` (its event time in ms), each packed row the latest event
    time of the partition's records under the name of ``spec.time_field`` (for the
    watermark)."""

    def split(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        keys = [batch.column(k).to_numpy(zero_copy_only=False) for k in spec.keys]
        if keys:
            buckets = np.mod(spark_xxhash64(*keys, kinds=spec.key_kinds), spec.buckets)
        else:  # a step over the whole stream: bucket 0, as translators/keyed.bucket_of places it
            buckets = np.zeros(batch.num_rows, dtype=np.int64)
        if spec.time_field is not None:
            batch = batch.append_column(spec.time_column, batch.column(spec.time_field).cast(pa.int64()))
        return batch, buckets

    yield from _packed((split(b) for b in batches), spec.bucket_column, spec.time_column, spec.time_field,
                       Reach(spec.buckets, spec.quiet_marks) if spec.every_bucket else None)


BucketFunction = Callable[[Any, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]


def unpacking(run: BucketFunction, latest: str | None = None) -> BucketFunction:
    """Wrap a bucket function so it receives the unpacked rows as one DataFrame (and, with
    ``latest``, the packed rows' latest event time as a fourth argument)."""

    def unpacked(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        packs = list(frames)
        tables = [pa.ipc.open_stream(blob).read_all() for pdf in packs for blob in pdf[PACKED_ROWS] if blob]
        # An integer column with nulls stays Python ints and None (not floats and NaN): a
        # nullable field, or a two-input step's fields of the other input (translators/coprocess.py).
        rows = iter([pa.concat_tables(tables).to_pandas(integer_object_nulls=True)]) if tables else iter([])
        if latest is None:
            return run(key, rows, state)
        times = [int(t) for pdf in packs for t in pdf[latest] if t is not None and t == t]
        return run(key, rows, state, max(times) if times else None)  # type: ignore[call-arg]

    return unpacked
