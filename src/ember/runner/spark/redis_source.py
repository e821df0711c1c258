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

from ember.runner.spark.checkpoint import admission_bound, admission_stopped, start_offset
from ember.runner.spark.in_driver import InDriver, use_the_simple_reader
from ember.runner.spark.json_decode import ARROW_TYPES, decode_json

__all__ = ["RedisStreamsDataSource", "decode_entries", "ZERO_ID"]

ZERO_ID = "0-0"

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


def _stream_infos(redis: Any, streams: list[str]) -> dict[str, tuple[int, str]]:
    """``(entries ever added, last id)`` of each stream (``XINFO STREAM``; O(1)); a
    missing stream counts as empty."""
    pipe = redis.pipeline(transaction=False)
    for s in streams:
        pipe.xinfo_stream(s)
    out = {}
    for s, info in zip(streams, pipe.execute(raise_on_error=False)):
        if isinstance(info, dict):
            last = info.get("last-generated-id", ZERO_ID)
            out[s] = (int(info.get("entries-added", 0)), last.decode() if isinstance(last, bytes) else str(last))
        else:
            out[s] = (0, ZERO_ID)
    return out


def _positions(offset: dict, streams: list[str]) -> dict:
    """``offset`` with a position for every one of ``streams``: before the first entry for one
    it does not hold."""
    return {**offset, "ids": {s: offset["ids"].get(s, ZERO_ID) for s in streams},
            "read": {s: int(offset["read"].get(s, 0)) for s in streams}}


class RedisStreamsReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.url = options["url"]
        self.streams: list[str] = json.loads(options["streams"])
        self.fields = [tuple(f) for f in json.loads(options["fields"])]
        self.max_rows = int(options["max_events_per_batch"])
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
        return start_offset(self.options, {"ids": {s: ZERO_ID for s in self.streams}, "read": {s: 0 for s in self.streams},
                                           "done": False})

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if admission_stopped(self.options):
            return start
        budget = admission_bound(self.options, self.max_rows if isinstance(limit, ReadAllAvailable) else int(limit.max_rows))
        share = max(1, budget // len(self.streams))
        redis = self.redis
        infos = _stream_infos(redis, self.streams)
        # A stream added since the checkpoint (a restart with more streams) is read from its
        # first entry; a stream no longer listed is no longer read.
        start = _positions(start, self.streams)
        ids, read, moved = dict(start["ids"]), dict(start["read"]), False
        cut = []
        for s in self.streams:
            added, last = infos[s]
            backlog = added - int(start["read"][s])
            if backlog <= 0 or last == start["ids"][s]:
                continue
            if backlog <= share:  # everything there fits: no need to count entries in Redis
                ids[s], read[s], moved = last, int(start["read"][s]) + backlog, True
            else:
                cut.append(s)
        if cut:  # a backlog larger than the bound: find the id of the share-th entry in Redis
            pipe = redis.pipeline(transaction=False)
            for s in cut:
                self._advance(keys=[s], args=[start["ids"][s], share], client=pipe)
            for s, (last, n) in zip(cut, pipe.execute()):
                ids[s] = last.decode() if isinstance(last, bytes) else str(last)
                read[s] = int(start["read"][s]) + int(n)
                moved = moved or int(n) > 0
        return {"ids": ids, "read": read, "done": self.stop_at_end and not moved}

    def reportLatestOffset(self) -> dict | None:
        """Entries added to each stream so far (``lag`` = added - read, in progress reports)."""
        try:
            infos = _stream_infos(self.redis, self.streams)
        except Exception:  # noqa: BLE001 - a report, not a reason to fail the batch
            return None
        return {"added": {s: added for s, (added, _) in infos.items()}}

    def partitions(self, start: dict, end: dict) -> list[_StreamRange]:
        start = _positions(start, self.streams)
        return [
            _StreamRange(s, start["ids"][s], end["ids"][s])
            for s in self.streams
            if end["ids"][s] != start["ids"][s]
        ]

    def read(self, part: _StreamRange) -> Iterator[pa.RecordBatch]:
        redis = _client(self.url)
        redis.set_response_callback("XRANGE", _raw)  # [[id, [field, value, ...]], ...], unparsed
        chunk = int(self.options["read_chunk"])
        dead = self.options["dead_letter"].format(stream=part.stream)
        after = part.after
        json_field = self.options.get("json_field") or None
        while True:
            entries = redis.xrange(part.stream, min=f"({after}", max=part.last, count=chunk)
            if not entries:
                return
            if json_field:
                batch, bad = decode_json_entries(entries, json_field, self.fields)
            else:
                batch, bad = decode_entries(entries, self.fields)
            if bad:
                _dead_letter(redis, dead, bad)
            if batch.num_rows:
                yield batch
            after = _text(entries[-1][0])
            if after == part.last:
                return

    def commit(self, end: dict) -> None:
        pass


def _raw(response: Any, **options: Any) -> Any:
    return response


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


RawEntry = tuple[bytes, list[bytes]]  # (id, [field, value, field, value, ...]) as Redis sends it


def _field_values(entries: list[RawEntry], names: list[bytes]) -> list[list[bytes | None]]:
    """Each declared field's values over ``entries``. Fast path: every entry holds
    exactly the declared fields in the declared order (what a producer writes)."""
    k = len(names)
    flat = [x for e in entries for x in e[1]]
    if len(flat) == 2 * k * len(entries):
        keys = flat[0::2]
        if all(keys[i::k].count(name) == len(entries) for i, name in enumerate(names)):
            values = flat[1::2]
            return [values[i::k] for i in range(k)]
    maps = [dict(zip(e[1][0::2], e[1][1::2])) for e in entries]
    return [[m.get(name) for m in maps] for name in names]


def decode_entries(
    entries: list[RawEntry], fields: list[tuple[str, str, bool]]
) -> tuple[pa.RecordBatch, list[tuple[bytes, dict[bytes, bytes], str]]]:
    """Entries -> one Arrow batch of the declared fields, plus the entries that
    cannot be read as declared, each with its raw fields and the reason."""
    columns = []
    failed = False
    values = _field_values(entries, [f[0].encode() for f in fields])
    for (_name, kind, nullable), raw_values in zip(fields, values):
        try:
            col = _cast(pa.array(raw_values, pa.binary()), kind)
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
        mapping = dict(zip(entry[1][0::2], entry[1][1::2]))
        reason = _entry_error(mapping, fields)
        (bad.append((entry[0], mapping, reason)) if reason else good.append(entry))
    if not good:
        return pa.RecordBatch.from_pylist([], schema=schema), bad
    batch, _ = decode_entries(good, fields)
    return batch, bad


def decode_json_entries(
    entries: list[RawEntry], json_field: str, fields: list[tuple[str, str, bool]]
) -> tuple[pa.RecordBatch, list[tuple[bytes, dict[bytes, bytes], str]]]:
    """Entries holding a JSON object in ``json_field`` -> one Arrow batch of the
    object's declared fields, plus the entries that cannot be decoded, with the reason."""
    texts = _field_values(entries, [json_field.encode()])[0]
    table, _, reasons = decode_json(pa.array(texts, pa.binary()), tuple(fields))
    schema = pa.schema([pa.field(name, ARROW_TYPES[kind], nullable) for name, kind, nullable in fields])
    batch = pa.RecordBatch.from_arrays([table.column(i).combine_chunks() for i in range(table.num_columns)], schema=schema)
    bad = []
    for i, reason in sorted(reasons.items()):
        entry_id, flat = entries[i]
        if texts[i] is None:
            reason = f"field '{json_field}' is missing"
        bad.append((entry_id, dict(zip(flat[0::2], flat[1::2])), reason))
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
        if self.options.get("in_driver") == "1":  # small batches: chosen by the translator (translators/sources.py)
            use_the_simple_reader()
        return RedisStreamsReader(self.options)

    def simpleStreamReader(self, schema: Any) -> Any:
        """Every stream read in the driver's source process, one after the other (in_driver.py)."""
        return InDriver(RedisStreamsReader(self.options))
