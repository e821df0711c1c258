"""Writing to Redis, Redis Streams and PostgreSQL exactly once, from Spark's executors.

Every sink keeps one fence per (job, sink, Spark partition): the last batch id
whose rows that partition wrote. A partition's rows and the advance of its
fence commit in one transaction (Redis MULTI/EXEC under WATCH; one PostgreSQL
transaction with the fence row locked), so a batch Spark replays after a crash
writes nothing twice: partitions that had committed see their fence at that
batch and skip, the others write. This relies on a replayed batch holding the
same rows in the same partition, which Spark gives for a replay from the same
checkpoint (same offsets, same state version, same partitioning).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ember.errors import ConfigError, PipelineError, UserFunctionError

__all__ = [
    "SinkTarget",
    "check_redis",
    "check_postgres",
    "redis_fenced_write",
    "redis_stream_writer",
    "prepare_postgres",
    "postgres_fenced_write",
    "FENCE_TABLE",
]

FENCE_TABLE = "ember_sink_fences"


@dataclass(frozen=True)
class SinkTarget:
    """Where a sink's fences live: the job (its checkpoint's id) and the sink step's name."""

    job_id: str
    sink: str

    @property
    def redis_fence_key(self) -> str:
        return f"ember:fence:{self.job_id}:{self.sink}"


# --------------------------------------------------------------------------- Redis
def check_redis(url: str, step: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=5).ping()
    except (redis.RedisError, ValueError) as exc:
        raise PipelineError(f"cannot reach Redis at {url}: {exc}", step) from None


def redis_fenced_write(
    url: str, target: SinkTarget, batch_id: int, partition: int, rows: Iterable[dict[str, Any]],
    write: Callable[[Any, dict[str, Any]], None],
) -> int:
    """Queues ``write(pipe, row)`` for every row and the fence advance in one
    MULTI/EXEC; nothing when this partition already wrote ``batch_id``.
    Returns the number of rows written."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=120)
    key, field = target.redis_fence_key, str(partition)
    rows = list(rows)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                done = pipe.hget(key, field)
                if done is not None and int(done) >= batch_id:  # type: ignore[arg-type]  # a sync client: a str
                    return 0
                pipe.multi()
                for row in rows:
                    try:
                        write(pipe, row)
                    except Exception as exc:  # the user's function: name the sink, the function and the row
                        raise UserFunctionError(
                            f"step '{target.sink}': the sink's write function {getattr(write, '__name__', 'write')} raised "
                            f"{type(exc).__name__}: {exc} on the row {row!r}; none of its partition's rows of this "
                            "micro-batch were written (one transaction)"
                        ) from exc
                pipe.hset(key, field, str(batch_id))
                pipe.execute()
                return len(rows)
            except redis.WatchError:  # another attempt of this task moved the fence: look again
                continue


def redis_stream_writer(stream: str, maxlen: int | None) -> Callable[[Any, dict[str, Any]], None]:
    def xadd(pipe: Any, row: dict[str, Any]) -> None:
        fields = {k: _redis_value(v) for k, v in row.items() if v is not None}
        if not fields:
            fields = {"_empty": ""}
        pipe.xadd(stream, fields, maxlen=maxlen, approximate=maxlen is not None)

    return xadd


def _redis_value(v: Any) -> Any:
    if isinstance(v, bool):  # before int: bool is an int, and redis-py refuses bools
        return int(v)
    if isinstance(v, (bytes, str, int, float)):
        return v
    return json.dumps(v, default=str)


# --------------------------------------------------------------------------- PostgreSQL
_PG_TYPES = {
    "StringType": "text", "BinaryType": "bytea", "BooleanType": "boolean", "ByteType": "smallint",
    "ShortType": "smallint", "IntegerType": "integer", "LongType": "bigint", "FloatType": "real",
    "DoubleType": "double precision", "TimestampType": "timestamptz", "TimestampNTZType": "timestamp",
    "DateType": "date",
}


def check_postgres(url: str, step: str) -> None:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("select 1")
    except psycopg.Error as exc:
        raise PipelineError(f"cannot reach PostgreSQL at {url}: {str(exc).strip()}", step) from None


def _pg_type(spark_type: Any) -> str:
    name = type(spark_type).__name__
    if name == "DecimalType":
        return f"numeric({spark_type.precision},{spark_type.scale})"
    if name in _PG_TYPES:
        return _PG_TYPES[name]
    return "jsonb"  # arrays, maps, structs


def _quote(name: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def prepare_postgres(url: str, table: str, schema: Any, mode: str, key: tuple[str, ...], create: bool, step: str) -> None:
    """Before the job starts: the fence table, and ``table`` (created from the
    stream's schema, or checked to have its columns)."""
    import psycopg

    check_postgres(url, step)
    columns = [f.name for f in schema.fields]
    missing_key = [k for k in key if k not in columns]
    if missing_key:
        raise ConfigError(f"step '{step}': PostgresSink key column(s) {missing_key} are not in the stream ({', '.join(columns)})")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"create table if not exists {FENCE_TABLE} (job text not null, sink text not null, "
            "part integer not null, batch bigint not null, primary key (job, sink, part))"
        )
        schema_name, _, bare = table.rpartition(".")
        found = conn.execute(
            "select column_name from information_schema.columns where table_name = %s"
            + (" and table_schema = %s" if schema_name else " and table_schema = current_schema()"),
            (bare, schema_name) if schema_name else (bare,),
        ).fetchall()
        if not found:
            if not create:
                raise ConfigError(f"step '{step}': PostgreSQL table {table!r} does not exist (and create=False)")
            cols = [f"{_quote(f.name)} {_pg_type(f.dataType)}" for f in schema.fields]
            if key:
                cols.append(f"primary key ({', '.join(_quote(k) for k in key)})")
            conn.execute(f"create table if not exists {_quote(table)} ({', '.join(cols)})")
            return
        have = {r[0] for r in found}
        absent = [c for c in columns if c not in have]
        if absent:
            raise ConfigError(f"step '{step}': PostgreSQL table {table!r} has no column(s) {absent} of the stream")


def postgres_fenced_write(
    url: str, target: SinkTarget, batch_id: int, partition: int, table: str, columns: list[str],
    mode: str, key: tuple[str, ...], rows: Iterator[tuple],
) -> int:
    """Claims the fence row (locked until commit) and writes the rows in the
    same transaction; nothing when this partition already wrote ``batch_id``."""
    import psycopg

    with psycopg.connect(url) as conn, conn.transaction():
        claimed = conn.execute(
            f"insert into {FENCE_TABLE} (job, sink, part, batch) values (%s, %s, %s, %s) "
            f"on conflict (job, sink, part) do update set batch = excluded.batch "
            f"where {FENCE_TABLE}.batch < excluded.batch returning batch",
            (target.job_id, target.sink, partition, batch_id),
        ).fetchone()
        if claimed is None:
            return 0
        cols = ", ".join(_quote(c) for c in columns)
        n = 0
        if mode == "append":
            with conn.cursor().copy(f"copy {_quote(table)} ({cols}) from stdin") as copy:
                for row in rows:
                    copy.write_row([_pg_value(v) for v in row])
                    n += 1
            return n
        update = [c for c in columns if c not in key]
        sql = (
            f"insert into {_quote(table)} ({cols}) values ({', '.join(['%s'] * len(columns))}) "
            f"on conflict ({', '.join(_quote(k) for k in key)}) do "
            + (f"update set {', '.join(f'{_quote(c)} = excluded.{_quote(c)}' for c in update)}" if update else "nothing")
        )
        batch = [[_pg_value(v) for v in row] for row in rows]
        with conn.cursor() as cur:
            cur.executemany(sql, batch)
        return len(batch)


def _pg_value(v: Any) -> Any:
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str)
    if hasattr(v, "asDict"):
        return json.dumps(v.asDict(recursive=True), default=str)
    return v

