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

from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

__all__ = ["PACKED_ROWS", "packer", "unpacking"]

PACKED_ROWS = "__ember_rows"


def packer(bucket: str, drop: tuple[str, ...]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: a partition's rows -> ``(bucket, Arrow IPC stream)``
    per bucket, without the ``drop`` columns; row order within a bucket is kept."""

    def pack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts: dict[int, list[pa.RecordBatch]] = {}
        schema = None
        for batch in batches:
            if batch.num_rows == 0:
                continue
            b = batch.column(bucket).to_numpy(zero_copy_only=False)
            order = np.argsort(b, kind="stable")
            data = batch.drop_columns([bucket, *[c for c in drop if c in batch.schema.names]]).take(pa.array(order))
            schema = data.schema
            sorted_b = b[order]
            edges = np.flatnonzero(np.diff(sorted_b)) + 1
            for start, end in zip([0, *edges.tolist()], [*edges.tolist(), len(order)]):
                parts.setdefault(int(sorted_b[start]), []).append(data.slice(start, end - start))
        if not parts:
            return
        blobs = []
        for slices in parts.values():
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, schema) as writer:
                for s in slices:
                    writer.write_batch(s)
            blobs.append(sink.getvalue().to_pybytes())
        yield pa.RecordBatch.from_arrays(
            [pa.array(list(parts), pa.int32()), pa.array(blobs, pa.binary())], names=[bucket, PACKED_ROWS]
        )

    return pack


def unpacking(run: Callable[[Any, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]) -> Callable[[Any, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """Wrap a bucket function so it receives the unpacked rows as one DataFrame."""

    def unpacked(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        tables = [pa.ipc.open_stream(blob).read_all() for pdf in frames for blob in pdf[PACKED_ROWS]]
        rows = iter([pa.concat_tables(tables).to_pandas()]) if tables else iter([])
        return run(key, rows, state)

    return unpacked
