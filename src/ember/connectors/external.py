"""Connectors to external systems: Redis Streams in, Redis / Redis Streams / PostgreSQL out.

Declarations only (no client is opened here); the Spark runner reads and
writes them (``ember.runner.spark.redis_source`` and ``.external_sinks``).

Addresses default to the environment: ``EMBER_REDIS_URL`` (else ``REDIS_URL``,
else ``redis://127.0.0.1:6379/0``) and ``EMBER_POSTGRES_URL`` (else
``DATABASE_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``).

Exactly-once sinks: each sink keeps a *fence* per Spark partition — the last
batch id it wrote for that partition of this job — and writes a partition's
rows in the same transaction that advances its fence. A replayed batch (after
a crash, Spark re-runs every batch it had not committed) finds its fence
already at that batch and writes nothing. Fences are namespaced by the job's
checkpoint (a new checkpoint starts new fences).
"""

from __future__ import annotations

import importlib.util
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ember.connectors.base import Sink, Source
from ember.errors import ConfigError

__all__ = [
    "RedisStreamSource",
    "RedisSink",
    "RedisStreamSink",
    "PostgresSink",
    "redis_url",
    "require_extra",
    "postgres_url",
    "yahoo_window_writer",
]


def redis_url(url: str | None = None) -> str:
    return url or os.environ.get("EMBER_REDIS_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"


def require_extra(connector: str, module: str, extra: str) -> None:
    """Fail when the connector is declared, not when the job runs, if its client library
    (an optional dependency) is missing."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"{connector} needs the '{module}' package, which Ember's core install leaves out: "
            f"pip install 'ember-stream[{extra}]'"
        )


def postgres_url(url: str | None = None) -> str:
    return (
        url
        or os.environ.get("EMBER_POSTGRES_URL")
        or os.environ.get("DATABASE_URL")
        or "postgresql://postgres@127.0.0.1:5432/test"
    )


# Spark types a Redis stream field (always a string on the wire) can be read as.
STREAM_FIELD_TYPES = ("string", "binary", "boolean", "tinyint", "smallint", "int", "bigint", "float", "double")


@dataclass(frozen=True)
class RedisStreamSource(Source):
    """Entries of one or more Redis streams; each stream is a partition.

    ``schema`` (Spark DDL) names the entry fields to read and their types;
    entries are read in id order, and offsets are entry ids, so any batch can
    be replayed exactly. ``max_events_per_batch`` bounds each micro-batch
    (admission control: a backlog is drained in bounded batches, never
    loaded at once; the name every bounded source shares —
    ``max_records_per_batch`` is its deprecated former name).

    An entry whose field cannot be read as its declared type, or that lacks a
    ``NOT NULL`` field, is not dropped: it goes to the dead-letter stream
    ``dead_letter.format(stream=...)`` with its raw fields plus ``error``
    (the reason), under its own entry id — a replayed batch re-adds nothing.
    Missing nullable fields read as null.

    ``json_field="event"``: each entry holds one JSON object in that field (as a
    broker message would) and ``schema`` names the object's fields (string,
    boolean, tinyint, smallint, int, bigint, float, double). Decoding is
    vectorised (Arrow's JSON reader); an entry that is not a JSON object, has a
    field of another type or lacks a ``NOT NULL`` field goes to the dead-letter
    stream with the reason. Decoding at the source keeps the job one straight
    line, so event-time windows can follow with no split for dead letters.

    ``stop_at_end=True`` makes the source bounded: it ends once a batch finds
    no new entry (for tests and catch-up runs); by default it reads forever.
    """

    streams: tuple[str, ...] = ()
    schema: str = ""
    url: str | None = None
    max_events_per_batch: int = 100_000
    stop_at_end: bool = False
    dead_letter: str = "{stream}:dead-letter"
    read_chunk: int = 10_000
    json_field: str | None = None

    def __init__(
        self,
        streams: str | Sequence[str],
        schema: str,
        *,
        url: str | None = None,
        max_events_per_batch: int | None = None,
        stop_at_end: bool = False,
        dead_letter: str = "{stream}:dead-letter",
        read_chunk: int = 10_000,
        json_field: str | None = None,
        max_records_per_batch: int | None = None,
    ) -> None:
        require_extra("RedisStreamSource", "redis", "redis")
        if max_records_per_batch is not None:
            if max_events_per_batch is not None:
                raise ConfigError("RedisStreamSource: give max_events_per_batch only (max_records_per_batch is its old name)")
            warnings.warn("RedisStreamSource: max_records_per_batch is now max_events_per_batch, the name every source uses",
                          DeprecationWarning, stacklevel=2)
            max_events_per_batch = max_records_per_batch
        if max_events_per_batch is None:
            max_events_per_batch = 100_000
        names = (streams,) if isinstance(streams, str) else tuple(streams)
        if not names or not all(isinstance(s, str) and s for s in names):
            raise ConfigError(f"RedisStreamSource: streams must be one or more stream names, got {streams!r}")
        if len(set(names)) != len(names):
            raise ConfigError(f"RedisStreamSource: a stream is listed twice in {names!r}")
        for name, value in (("max_events_per_batch", max_events_per_batch), ("read_chunk", read_chunk)):
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"RedisStreamSource: {name} must be a positive int, got {value!r}")
        if "{stream}" not in dead_letter:
            raise ConfigError(f"RedisStreamSource: dead_letter must contain '{{stream}}', got {dead_letter!r}")
        if json_field is not None and (not isinstance(json_field, str) or not json_field):
            raise ConfigError(f"RedisStreamSource: json_field must name an entry field, got {json_field!r}")
        fields = parse_json_schema(schema, "RedisStreamSource") if json_field is not None else parse_stream_schema(schema)
        for s in names:
            if dead_letter.format(stream=s) in names:
                raise ConfigError(f"RedisStreamSource: stream {s!r}'s dead-letter stream is also read")
        settings: tuple[tuple[str, Any], ...] = (
            ("streams", names), ("schema", schema), ("url", url), ("max_events_per_batch", max_events_per_batch),
            ("stop_at_end", bool(stop_at_end)), ("dead_letter", dead_letter), ("read_chunk", read_chunk),
            ("json_field", json_field),
        )
        for key, value in settings:
            object.__setattr__(self, key, value)
        object.__setattr__(self, "_fields", fields)

    @property
    def max_records_per_batch(self) -> int:
        """Deprecated name of :attr:`max_events_per_batch`."""
        return self.max_events_per_batch

    @property
    def fields(self) -> list[tuple[str, str, bool]]:
        """``(name, spark type, nullable)`` of each declared field."""
        return list(self._fields)  # type: ignore[attr-defined]

    @property
    def bounded(self) -> bool:
        return self.stop_at_end

    @property
    def schema_ddl(self) -> str:
        return self.schema

    def dead_letter_stream(self, stream: str) -> str:
        return self.dead_letter.format(stream=stream)

    def describe(self) -> str:
        return f"redis streams {', '.join(self.streams)} at {_safe(redis_url(self.url))}"


def parse_stream_schema(schema: str) -> tuple[tuple[str, str, bool], ...]:
    """``"a int, b string not null"`` -> ``(("a", "int", True), ("b", "string", False))``."""
    return parse_field_schema(schema, "RedisStreamSource")


def parse_json_schema(schema: str, who: str) -> tuple[tuple[str, str, bool], ...]:
    """:func:`parse_field_schema` for the fields of a JSON object (JSON has no binary values)."""
    fields = parse_field_schema(schema, who)
    binary = [name for name, kind, _ in fields if kind == "binary"]
    if binary:
        raise ConfigError(f"{who}: JSON has no binary values; field(s) {binary} cannot be binary")
    return fields


def parse_field_schema(schema: str, who: str) -> tuple[tuple[str, str, bool], ...]:
    """Flat fields of simple types, ``name type [NOT NULL]``, for ``who``'s messages."""
    if not isinstance(schema, str) or not schema.strip():
        raise ConfigError(f"{who}: schema (Spark DDL of the fields) is required")
    out = []
    for part in schema.split(","):
        m = re.fullmatch(r"\s*`?([A-Za-z_][\w]*)`?\s+(\w+)(\s+not\s+null)?\s*", part, flags=re.I)
        if not m:
            raise ConfigError(f"{who}: cannot read schema field {part.strip()!r} (want 'name type [NOT NULL]')")
        name, kind = m.group(1), m.group(2).lower()
        kind = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint", "real": "float", "bool": "boolean"}.get(kind, kind)
        if kind not in STREAM_FIELD_TYPES:
            raise ConfigError(
                f"{who}: field {name!r} has type {kind!r}; fields can be read as {', '.join(STREAM_FIELD_TYPES)}"
            )
        out.append((name, kind, m.group(3) is None))
    names = [f[0] for f in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{who}: a field is declared twice in {schema!r}")
    return tuple(out)


def _safe(url: str) -> str:
    """``url`` without a password."""
    return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:***@", url)


_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)?$")


class RedisSink(Sink):
    """Writes each row with ``write(pipe, row)`` — any Redis commands, queued on a
    transaction pipeline (``redis.client.Pipeline``) — exactly once: a Spark
    partition's commands and its fence run in one MULTI/EXEC."""

    def __init__(self, write: Callable[[Any, dict[str, Any]], None], *, url: str | None = None) -> None:
        require_extra("RedisSink", "redis", "redis")
        if not callable(write):
            raise ConfigError(f"RedisSink: write must be a function (pipe, row) -> None, got {write!r}")
        self.write = write
        self.url = url

    def describe(self) -> str:
        return f"redis at {_safe(redis_url(self.url))} ({getattr(self.write, '__name__', 'write')})"


_YAHOO_WINDOW = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HSET', KEYS[1], 'windows', ARGV[3])
  redis.call('LPUSH', ARGV[3], ARGV[1])
end
"""


def yahoo_window_writer(
    key: str = "campaign_id", window: str = "window_start", count: str = "count", *, cumulative: bool = False,
    prefix: str = "",
) -> Callable[[Any, dict[str, Any]], None]:
    """A :class:`RedisSink` write function with the Yahoo benchmark's output layout
    (WORKLOADS.md E5) for a row ``(campaign, window start ms, views)``:

    - hash ``<campaign>``: field ``<window_ts>`` -> the window's id, field ``windows`` -> the id
      of the campaign's window list; the list ``<list id>`` gets ``<window_ts>`` pushed once;
    - hash ``<window id>``: ``seen_count`` and ``time_updated`` (epoch ms of the write).

    Ids are UUIDs derived from (campaign, window), so a window keeps its id across
    updates and replays. ``cumulative=False`` (final-only results, each window
    emitted once) adds the row's count with ``HINCRBY``, as the original;
    ``cumulative=True`` (results updated while a window is open, each row holding
    the count so far) sets it with ``HSET``. ``prefix`` is put before every key
    (the original layout has none).
    """
    import time
    import uuid

    namespace = uuid.UUID("6f1d6c1e-2f38-4a53-9a7c-0f3e3d6b5a11")

    def write(pipe: Any, row: dict[str, Any]) -> None:
        campaign, ts, n = str(row[key]), int(row[window]), int(row[count])
        window_id = prefix + str(uuid.uuid5(namespace, f"{campaign}/{ts}"))
        list_id = prefix + str(uuid.uuid5(namespace, f"{campaign}/windows"))
        pipe.eval(_YAHOO_WINDOW, 1, prefix + campaign, ts, window_id, list_id)
        if cumulative:
            pipe.hset(window_id, "seen_count", n)
        else:
            pipe.hincrby(window_id, "seen_count", n)
        pipe.hset(window_id, "time_updated", int(time.time() * 1000))

    return write


class RedisStreamSink(Sink):
    """Appends each row as an entry of ``stream`` (its columns as fields; nulls
    left out) exactly once; ``maxlen`` trims the stream approximately."""

    def __init__(self, stream: str, *, url: str | None = None, maxlen: int | None = None) -> None:
        require_extra("RedisStreamSink", "redis", "redis")
        if not isinstance(stream, str) or not stream:
            raise ConfigError(f"RedisStreamSink: stream must be a non-empty name, got {stream!r}")
        if maxlen is not None and (not isinstance(maxlen, int) or maxlen <= 0):
            raise ConfigError(f"RedisStreamSink: maxlen must be a positive int, got {maxlen!r}")
        self.stream = stream
        self.url = url
        self.maxlen = maxlen

    def describe(self) -> str:
        return f"redis stream {self.stream} at {_safe(redis_url(self.url))}"


_PG_MODES = ("append", "upsert")


@dataclass(eq=False)
class PostgresSink(Sink):
    """Rows into PostgreSQL ``table``, exactly once: each Spark partition's rows
    and its fence row (table ``ember_sink_fences``) commit in one transaction.

    ``mode="append"`` inserts every row; ``mode="upsert"`` inserts or updates
    on ``key`` (the table's primary key, a list of columns). A missing table is
    created from the stream's schema before the job starts (``create=True``).
    """

    table: str
    url: str | None = None
    mode: str = "append"
    key: tuple[str, ...] = field(default=())
    create: bool = True

    def __post_init__(self) -> None:
        require_extra("PostgresSink", "psycopg", "postgres")
        if not isinstance(self.table, str) or not _NAME.match(self.table):
            raise ConfigError(f"PostgresSink: table must be a name like 'alerts' or 'schema.alerts', got {self.table!r}")
        if self.mode not in _PG_MODES:
            raise ConfigError(f"PostgresSink: mode must be one of {', '.join(_PG_MODES)}, got {self.mode!r}")
        self.key = (self.key,) if isinstance(self.key, str) else tuple(self.key)
        if self.mode == "upsert" and not self.key:
            raise ConfigError("PostgresSink: mode='upsert' needs key=[columns of the primary key]")
        if self.mode == "append" and self.key:
            raise ConfigError("PostgresSink: key is only used with mode='upsert'")

    def describe(self) -> str:
        return f"postgres {self.table} ({self.mode}) at {_safe(postgres_url(self.url))}"
