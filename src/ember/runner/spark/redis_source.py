"""``ember_redis_streams``: Redis streams as a replayable Spark streaming source.

Offsets are ``{"ids": {stream: last entry id read}, "read": {stream: entries
read}, "done": bool}``. A micro-batch ``(start, end]`` reads, per stream, the
entries with ids after ``start`` up to and including ``end``: a pure function
of its offsets, so Spark's replays read exactly the same entries.

Admission control: ``latestOffset`` advances each stream by at most its share
of the read limit. It finds the new end id with a server-side script (no entry
crosses the network twice). Lag — entries added to a stream and not yet read —
is reported as the source's latest offset (``entries-added`` of ``XINFO``).

Decoding: a chunk of entries becomes one Arrow batch, each field cast to its
declared type in bulk; only when a chunk has a bad value is it checked entry
by entry, and the bad entries go to the dead-letter stream (same id, raw
fields plus ``error``), so a replay re-adds nothing.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

__all__ = ["RedisStreamsDataSource", "decode_entries", "ARROW_TYPES", "ZERO_ID"]

ZERO_ID = "0-0"
ARROW_TYPES = {
    "string": pa.string(), "binary": pa.binary(), "boolean": pa.bool_(), "tinyint": pa.int8(),
    "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(),
}

# Last id and count of the next ARGV[2] entries after ARGV[1] (exclusive), computed in Redis.
_ADVANCE = """
local r = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))
if #r == 0 then return {ARGV[1], 0} end
return {r[#r][1], #r}
"""


def _client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=60, socket_connect_timeout=10, health_check_interval=30)


class _StreamRange(InputPartition):
    def __init__(self, stream: str, after: str, last: str) -> None:
        self.stream, self.after, self.last = stream, after, last


class RedisStreamsReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.url = options["url"]
        self.streams: list[str] = json.loads(options["streams"])
        self.fields = [tuple(f) for f in json.loads(options["fields"])]
        self.max_rows = int(options["max_records_per_batch"])
        self.stop_at_end = options.get("stop_at_end") == "true"
        self._redis = None
        self._advance = None

    @property
    def redis(self) -> Any:
        if self._redis is None:
            self._redis = _client(self.url)
            self._advance = self._redis.register_script(_ADVANCE)
        return self._redis

    def initialOffset(self) -> dict:
        return {"ids": {s: ZERO_ID for s in self.streams}, "read": {s: 0 for s in self.streams}, "done": False}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        from ember.runner.spark.datasources import _stopping

        if _stopping(self.options):
            return start
        budget = self.max_rows if isinstance(limit, ReadAllAvailable) else int(limit.max_rows)
        share = max(1, budget // len(self.streams))
        redis = self.redis
        pipe = redis.pipeline(transaction=False)
        for s in self.streams:
            self._advance(keys=[s], args=[start["ids"][s], share], client=pipe)
        ids, read, moved = {}, {}, False
        for s, (last, n) in zip(self.streams, pipe.execute()):
            ids[s] = last.decode() if isinstance(last, bytes) else str(last)
            read[s] = int(start["read"][s]) + int(n)
            moved = moved or int(n) > 0
        return {"ids": ids, "read": read, "done": self.stop_at_end and not moved}

    def reportLatestOffset(self) -> dict | None:
        """Entries added to each stream so far (``lag`` = added - read, in progress reports)."""
        try:
            pipe = self.redis.pipeline(transaction=False)
            for s in self.streams:
                pipe.xinfo_stream(s)
            infos = pipe.execute(raise_on_error=False)
        except Exception:  # noqa: BLE001 - a report, not a reason to fail the batch
            return None
        added = {s: int(i.get("entries-added", 0)) if isinstance(i, dict) else 0 for s, i in zip(self.streams, infos)}
        return {"added": added}

    def partitions(self, start: dict, end: dict) -> list[_StreamRange]:
        return [
            _StreamRange(s, start["ids"][s], end["ids"][s])
            for s in self.streams
            if end["ids"][s] != start["ids"][s]
        ]

    def read(self, part: _StreamRange) -> Iterator[pa.RecordBatch]:
        redis = _client(self.url)
        chunk = int(self.options["read_chunk"])
        dead = self.options["dead_letter"].format(stream=part.stream)
        after = part.after
        while True:
            entries = redis.xrange(part.stream, min=f"({after}", max=part.last, count=chunk)
            if not entries:
                return
            batch, bad = decode_entries(entries, self.fields)
            if bad:
                _dead_letter(redis, dead, bad)
            if batch.num_rows:
                yield batch
            after = entries[-1][0].decode()
            if after == part.last:
                return

    def commit(self, end: dict) -> None:
        pass


def decode_entries(
    entries: list[tuple[bytes, dict[bytes, bytes]]], fields: list[tuple[str, str, bool]]
) -> tuple[pa.RecordBatch, list[tuple[bytes, dict[bytes, bytes], str]]]:
    """Entries -> one Arrow batch of the declared fields, plus the entries that
    cannot be read as declared, each with its reason."""
    columns = []
    failed = False
    for name, kind, nullable in fields:
        key = name.encode()
        raw = pa.array([e[1].get(key) for e in entries], pa.binary())
        try:
            col = _cast(raw, kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
            failed = True
            break
        if not nullable and col.null_count:
            failed = True
            break
        columns.append(col)
    schema = pa.schema([pa.field(name, ARROW_TYPES[kind], nullable) for name, kind, nullable in fields])
    if not failed:
        return pa.RecordBatch.from_arrays(columns, schema=schema), []
    good, bad = [], []
    for entry in entries:
        reason = _entry_error(entry[1], fields)
        (bad.append((entry[0], entry[1], reason)) if reason else good.append(entry))
    if not good:
        return pa.RecordBatch.from_pylist([], schema=schema), bad
    batch, _ = decode_entries(good, fields)
    return batch, bad


def _cast(raw: pa.Array, kind: str) -> pa.Array:
    """Bytes -> ``kind``; raises on bad UTF-8, junk and overflow (Arrow's strict casts)."""
    if kind == "binary":
        return raw
    text = raw.cast(pa.string())
    if kind == "string":
        return text
    return pc.utf8_trim_whitespace(text).cast(ARROW_TYPES[kind])


def _entry_error(values: dict[bytes, bytes], fields: list[tuple[str, str, bool]]) -> str | None:
    for name, kind, nullable in fields:
        raw = values.get(name.encode())
        if raw is None:
            if not nullable:
                return f"field '{name}' is missing (declared NOT NULL)"
            continue
        try:
            _cast(pa.array([raw], pa.binary()), kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
            shown = raw[:80].decode("utf-8", "replace")
            return f"field '{name}': cannot read {shown!r} as {kind}"
    return None


def _dead_letter(redis: Any, stream: str, bad: list[tuple[bytes, dict[bytes, bytes], str]]) -> None:
    """Adds each bad entry under its own id; ids already there (a replay) are skipped."""
    from redis.exceptions import ResponseError

    pipe = redis.pipeline(transaction=False)
    for entry_id, values, reason in bad:
        pipe.xadd(stream, {**values, b"error": reason.encode()}, id=entry_id)
    for result in pipe.execute(raise_on_error=False):
        if isinstance(result, ResponseError) and "equal or smaller" not in str(result):
            raise result


class RedisStreamsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ember_redis_streams"

    def schema(self) -> str:
        return self.options["schema"]

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return RedisStreamsReader(self.options)
