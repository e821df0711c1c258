"""Arrow batches produced inside Spark's Python workers by ``ember_sequence``."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from ember.connectors import generators as g

__all__ = ["sequence_batches", "partition_offsets", "source_spec", "yahoo_json"]

_KINDS: dict[str, type[g.GeneratorSource]] = {
    cls.__name__: cls for cls in (g.YahooSource, g.GrepSource, g.GroupingSource, g.StateMachineSource, g.AdClickSource,
                                    g.RuleSource)
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
    if spec["kind"] == "YahooSource" and spec["fields"].get("as_json"):
        yahoo = g.YahooSource(**spec["fields"])
        for lo in range(a, b, chunk):
            seq = np.arange(lo, min(b, lo + chunk), dtype=np.int64) * parts + partition
            yield pa.RecordBatch.from_arrays([yahoo_json(yahoo, seq, origin_ms)], names=["event"])
        return
    for lo in range(a, b, chunk):
        hi = min(b, lo + chunk)
        seq = np.arange(lo, hi, dtype=np.int64) * parts + partition
        origin = pa.array(np.full(hi - lo, origin_ms, dtype=np.int64))
        yield pa.RecordBatch.from_arrays([pa.array(seq), origin], names=["seq", "origin_ms"])


# --------------------------------------------------------------------------- Yahoo events as JSON text
# The text json.dumps(record, separators=(",", ":")) gives for YahooSource.records (tested), written
# by compiled code: the generator must not be what a JSON benchmark measures.
_YAHOO_KEYS = ("user_id", "page_id", "ad_id", "ad_type", "event_type", "event_time")


@functools.lru_cache(maxsize=8)
def _pieces(source: g.YahooSource) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The literal JSON between values (one byte string, offsets) and each picked field's choices."""
    literals = [b'{"' + _YAHOO_KEYS[0].encode() + b'":"']
    literals += [b'","' + k.encode() + b'":"' for k in _YAHOO_KEYS[1:]]
    literals += [b'","ip_address":"1.2.3.4"}']
    ids = source.ids
    choices = []
    for values in (ids["users"], ids["pages"], ids["ads"], g.AD_TYPES, g.EVENT_TYPES):
        encoded = [v.encode() for v in values]
        choices.append((np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(),
                        np.cumsum([0] + [len(v) for v in encoded]).astype(np.int64)))
    return (np.frombuffer(b"".join(literals), dtype=np.uint8).copy(),
            np.cumsum([0] + [len(x) for x in literals]).astype(np.int64), choices)


def yahoo_json(source: g.YahooSource, seq: np.ndarray, origin_ms: int) -> pa.Array:
    """The events of ``seq`` as JSON texts (an Arrow string array)."""
    from ember.runner.spark.json_write import write_yahoo

    h = source.hash(seq)
    t = source.event_time_ms(seq, origin_ms)
    if source.skew_ms:
        t = t + (h >> 48) % (2 * source.skew_ms + 1) - source.skew_ms
    picks = np.stack([(h >> 20) % 100, (h >> 30) % 100, h % source.num_ads, (h >> 40) % 5, (h >> 10) % 3])
    literals, literal_offsets, choices = _pieces(source)
    values = np.concatenate([c[0] for c in choices])
    bases = np.cumsum([0] + [len(c[0]) for c in choices[:-1]])
    value_offsets = np.concatenate([c[1] + base for c, base in zip(choices, bases)])
    firsts = np.cumsum([0] + [len(c[1]) for c in choices[:-1]]).astype(np.int64)  # each field's first choice
    offsets = np.empty(len(seq) + 1, dtype=np.int32)
    body = write_yahoo(picks.astype(np.int64), t.astype(np.int64), literals, literal_offsets, values,
                       value_offsets.astype(np.int64), firsts, source.malformed(seq), offsets)
    return pa.Array.from_buffers(pa.string(), len(seq), [None, pa.py_buffer(offsets), pa.py_buffer(body)])
