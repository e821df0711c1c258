"""Written state on the delta layout (state_io._delta_rows, no Spark): each bucket's rows decode
to exactly the keys written — keys whose hashes collide kept in the bucket's overflow — with a
new version describing the one compacted part."""

import pickle
import struct

import numpy as np
import pandas as pd

from ember.runner.spark.keyed import delta
from ember.runner.spark.keyed.runtime import EVENT_TIMERS, empty_bucket_state
from ember.runner.spark.state_io import _delta_rows


def _payload(value: bytes) -> bytes:
    """The binary field of an UnsafeRow of struct<one binary>."""
    offset_and_size = struct.unpack_from("<q", value, 8)[0]
    offset, size = offset_and_size >> 32, offset_and_size & 0xFFFFFFFF
    return value[offset:offset + size]


def _by_family(rows):
    out: dict[tuple[int, str], list[bytes]] = {}
    for bucket, family, value in rows:
        out.setdefault((bucket, family), []).append(value)
    return out


def test_a_process_functions_bucket_keeps_colliding_keys_in_its_overflow(monkeypatch):
    # Every key of the same length shares a hash: "a" and "b" collide, "cc" does not.
    monkeypatch.setattr(delta, "key_hashes", lambda keys: np.array([len(str(k)) for k in keys], np.int64))
    blob = empty_bucket_state()
    blob["keys"] = {"a": {"n": 1, EVENT_TIMERS: {50}}, "b": {"n": 2}, "cc": {"n": 3}}
    blob[EVENT_TIMERS] = [(50, 1, "a")]
    rows = _by_family(_delta_rows({"name": "s", "kind": "process function"}, {4: blob}, {}))
    assert set(rows) == {(4, "parts"), (4, "$rowCounter_parts"), (4, "blob")}
    part = delta.decode_part(_payload(rows[(4, "parts")][0]))
    entries = [pickle.loads(b) for b in part.column("slot").to_pylist()]
    assert part.column(delta.KEY).to_pylist() == [1, 2]  # the hashes, sorted, one entry each
    meta = pickle.loads(_payload(rows[(4, "blob")][0]))
    assert dict(entries) | meta[delta.OVERFLOW] == blob["keys"] and len(meta[delta.OVERFLOW]) == 1
    assert meta["keys"] == {} and meta[EVENT_TIMERS] == []  # the slots keep the timers (the queues are rebuilt)
    tag, parts, logged, live = meta["version"]
    assert (parts, logged, live) == (1, 2, 2) and len(tag) == 24
    assert struct.unpack("<qq", rows[(4, "$rowCounter_parts")][0]) == (0, 1)


def test_a_vectorised_buckets_version_row_decodes_and_its_tag_is_new():
    table = pd.DataFrame({"total": [5.0, 7.0], "n": [1, 2]}, index=pd.Index([9, -3]))
    op = {"name": "v", "kind": "vectorised process function", "state": {"state schema": "total bigint, n int"}}
    written = [_by_family(_delta_rows(op, {2: table}, {})) for _ in range(2)]
    rows = written[0]
    part = delta.decode_part(_payload(rows[(2, "parts")][0]))
    assert part.column(delta.KEY).to_pylist() == [-3, 9]  # sorted, as the working copy's index
    assert part.column("total").to_pylist() == [7, 5] and str(part.schema.field("total").type) == "int64"
    assert str(part.schema.field("n").type) == "int32"
    version = rows[(2, "version")][0]
    offset_and_size, parts, logged, live = struct.unpack_from("<qqqq", version, 8)
    offset, size = offset_and_size >> 32, offset_and_size & 0xFFFFFFFF
    assert (offset, size, parts, logged, live) == (40, 24, 1, 2, 2) and len(version) % 8 == 0
    tags = [r[(2, "version")][0][offset:offset + size] for r in written]
    assert tags[0] != tags[1]  # each write a new version: no working copy of an earlier state matches it
