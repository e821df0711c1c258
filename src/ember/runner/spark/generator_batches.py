"""Arrow batches produced inside Spark's Python workers by ``ember_sequence``."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from ember.connectors import generators as g

__all__ = ["sequence_batches", "partition_offsets", "source_spec"]

_KINDS: dict[str, type[g.GeneratorSource]] = {
    cls.__name__: cls for cls in (g.YahooSource, g.GrepSource, g.GroupingSource, g.StateMachineSource)
}


def source_spec(source: g.GeneratorSource, max_events_per_batch: int) -> dict[str, Any]:
    """The JSON-able description the Python reader rebuilds the source from."""
    fields = dataclasses.asdict(source)
    return {
        "kind": type(source).__name__,
        "fields": fields,
        "rate": source.rate,
        "max_events": source.max_events,
        "partitions": source.partitions,
        "max_events_per_batch": source.max_events_per_batch or max_events_per_batch,
        "start_ms": source.start_ms,
    }


def partition_offsets(partition: int, partitions: int, n0: int, n1: int) -> tuple[int, int]:
    """Partition offsets ``[a, b)`` covering the sequence numbers ``[n0, n1)`` of ``partition``."""
    a = max(0, -(-(n0 - partition) // partitions))
    b = max(0, -(-(n1 - partition) // partitions))
    return a, b


def sequence_batches(
    spec: dict[str, Any], partition: int, n0: int, n1: int, origin_ms: int, chunk: int
) -> Iterator[pa.RecordBatch]:
    """Partition ``partition``'s records among sequence numbers ``[n0, n1)``."""
    parts = int(spec["partitions"])
    a, b = partition_offsets(partition, parts, n0, n1)
    if spec["kind"] == "StateMachineSource":
        source = g.StateMachineSource(**spec["fields"])
        eps = int(source.events_per_second)
        for lo in range(a, b, chunk):
            hi = min(b, lo + chunk)
            addr, types, _ = source.events(partition, lo, hi)
            seq = np.arange(lo, hi, dtype=np.int64) * parts + partition
            ts = origin_ms + (seq * 1000) // eps
            yield pa.RecordBatch.from_arrays(
                [pa.array(addr, pa.int32()), pa.array(types, pa.int8()), pa.array(ts, pa.int64())],
                names=["address", "type", "ts"],
            )
        return
    for lo in range(a, b, chunk):
        hi = min(b, lo + chunk)
        seq = np.arange(lo, hi, dtype=np.int64) * parts + partition
        origin = pa.array(np.full(hi - lo, origin_ms, dtype=np.int64))
        yield pa.RecordBatch.from_arrays([pa.array(seq), origin], names=["seq", "origin_ms"])
