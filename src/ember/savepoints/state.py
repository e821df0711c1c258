"""A small State Processor API: read an operator's state from a savepoint as a
DataFrame, and write a modified state into a new savepoint.

Reading uses Spark's state data source (``spark.read.format("statestore")``)
and decodes Ember's layout: a keyed operator keeps one value per state bucket,
the bucket's keys and their states pickled together (runner/spark/keyed/runtime.py),
so a bucket row becomes one row per (key, state name). Spark's own operators
(native window aggregations) are shown as Spark stores them, key and value
fields flattened.

Writing uses Spark's offline state rewriter (``StateRewriter``, the machinery
behind Spark 4.3's state repartitioning): the savepoint is copied to a staging
checkpoint, an empty micro-batch N + 1 is appended to its logs (same source
offsets: no input is skipped or repeated), and the rewriter writes state
version N + 2 of every operator — unchanged, except the one being written,
whose rows Ember computes on the driver — then the staging checkpoint is cut
into the new savepoint. The state store rows are Spark UnsafeRows; Ember's
keyed operators have a fixed layout (key: the int bucket; value: one binary
field and the group-state timeout), which :func:`_encode_value` writes.
"""

from __future__ import annotations

import heapq
import os
import pickle
import shutil
import struct
import tempfile
from typing import Any, Callable

import pandas as pd

from ember.runner.spark.keyed.runtime import _ET, _PT, _empty_blob  # the keyed runtime's bucket layout
from ember.savepoints.store import SavepointError, copy_into_checkpoint, cut_checkpoint, verify

__all__ = ["read_state", "write_state", "STATE_KINDS_WRITABLE"]

KEYED = ("process function", "window")
VECTORISED = "vectorised process function"
STATE_KINDS_WRITABLE = ("process function", VECTORISED)
NO_TIMEOUT = -1


def _operator(manifest: dict[str, Any], name: str) -> tuple[int, dict[str, Any]]:
    ops = manifest["pipeline"]["operators"]
    for i, op in enumerate(ops):
        if op["name"] == name:
            return i, op
    known = ", ".join(f"'{o['name']}'" for o in ops) or "none"
    raise SavepointError(f"the savepoint has no stateful operator '{name}' (it has: {known})")


def _state_frame(spark: Any, path: str, manifest: dict[str, Any], op_id: int) -> Any:
    """Operator ``op_id``'s state rows at the savepoint's batch (Spark's state data source)."""
    return spark.read.format("statestore").option("batchId", int(manifest["batch_id"])).option("operatorId", op_id).load(path)


def _buckets(spark: Any, path: str, manifest: dict[str, Any], op_id: int) -> dict[int, Any]:
    """bucket -> its unpickled state (Ember's keyed operators)."""
    out = {}
    for row in _state_frame(spark, path, manifest, op_id).collect():
        blob = row["value"]["groupState"][0]
        out[int(row["key"][0])] = pickle.loads(blob)
    return out


def read_state(spark: Any, path: str, operator: str) -> pd.DataFrame:
    """Operator ``operator``'s state in the savepoint at ``path`` (verified first).

    - a process function (and a Python window operator): one row per key and
      state name — the key field(s), ``state``, ``value`` (as the function
      stored it; timers are not listed);
    - a vectorised process function: its state table — key field(s) and the
      ``state_schema`` fields;
    - a native window aggregation: Spark's state rows, key and value fields flattened.
    """
    manifest = verify(path)
    op_id, op = _operator(manifest, operator)
    keys = list(op["keys"])
    if op["kind"] in KEYED:
        rows = []
        for blob in _buckets(spark, path, manifest, op_id).values():
            for key, slot in blob["keys"].items():
                key_values = list(key) if len(keys) > 1 else [key]
                rows += [[*key_values, name, value] for name, value in slot.items() if name not in (_ET, _PT)]
        frame = pd.DataFrame(rows, columns=[*keys, "state", "value"])
        return frame.sort_values([*keys, "state"], ignore_index=True) if len(frame) else frame
    if op["kind"] == VECTORISED:
        tables = [t for t in _buckets(spark, path, manifest, op_id).values() if len(t)]
        if not tables:
            return pd.DataFrame(columns=keys)
        table = pd.concat(tables)
        table.index.names = keys
        return table.reset_index().sort_values(keys, ignore_index=True)
    return _state_frame(spark, path, manifest, op_id).select("key.*", "value.*").toPandas()


# -- writing -----------------------------------------------------------------------------


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def _encode_key(bucket: int) -> bytes:
    """UnsafeRow of struct<__ember_bucket: int>: null bits, one 8-byte slot."""
    return struct.pack("<qi4x", 0, bucket)


def _encode_value(payload: bytes, timeout: int) -> bytes:
    """UnsafeRow of struct<groupState: struct<one binary>, timeoutTimestamp: bigint>."""
    inner = struct.pack("<qq", 0, (16 << 32) | len(payload)) + payload + b"\0" * (_pad8(len(payload)) - len(payload))
    return struct.pack("<qqq", 0, (24 << 32) | len(inner), timeout) + inner


def _place_new_keys(spark: Any, op: dict[str, Any], where: dict[Any, int], keys: list[Any]) -> None:
    """Add the state bucket of each key in ``keys`` (not yet in ``where``) to ``where``,
    computed by Spark with the job's own bucket expression and key types."""
    from ember.runner.spark.translators.keyed import bucket_of

    new = [k for k in keys if k not in where]
    if not new:
        return
    types, names = op.get("key_types"), list(op["keys"])
    if not types:
        raise SavepointError(
            f"operator '{op['name']}': this savepoint does not record its key types, so new keys cannot be placed"
        )
    ddl = ", ".join(f"`{k}` {t}" for k, t in zip(names, types))
    df = spark.createDataFrame([k if len(names) > 1 else (k,) for k in new], ddl)
    where.update(zip(new, (int(r[0]) for r in df.select(bucket_of(tuple(names))).collect())))


def _new_keyed_blobs(
    spark: Any, old: dict[int, Any], op: dict[str, Any], frame: pd.DataFrame
) -> dict[int, Any]:
    """The buckets of a process function whose keyed state becomes ``frame`` (read_state's layout)."""
    keys = list(op["keys"])
    missing = [c for c in [*keys, "state", "value"] if c not in frame.columns]
    if missing:
        raise SavepointError(f"the new state lacks the column(s) {missing}; it has the layout read_state returns")
    where: dict[Any, int] = {}
    old_slots: dict[Any, dict[str, Any]] = {}
    for bucket, blob in old.items():
        for key, slot in blob["keys"].items():
            where[key], old_slots[key] = bucket, slot
    slots: dict[Any, dict[str, Any]] = {}
    for record in frame[[*keys, "state", "value"]].itertuples(index=False):
        key = tuple(record[: len(keys)]) if len(keys) > 1 else record[0]
        slots.setdefault(key, {})[record[-2]] = record[-1]
    _place_new_keys(spark, op, where, list(slots))
    blobs: dict[int, Any] = {b: _empty_blob() for b in set(old) | {where[k] for k in slots}}
    for key, states in slots.items():
        timers = {n: t for n, t in old_slots.get(key, {}).items() if n in (_ET, _PT)}  # a kept key keeps its timers
        blobs[where[key]]["keys"][key] = {**states, **timers}
    for blob in blobs.values():
        for key, slot in blob["keys"].items():
            for kind in (_ET, _PT):
                for ts in sorted(slot.get(kind, ())):
                    blob["n"] += 1
                    heapq.heappush(blob[kind], (int(ts), blob["n"], key))
    return {b: blob for b, blob in blobs.items() if blob["keys"]}


def _new_vectorised_tables(spark: Any, old: dict[int, Any], op: dict[str, Any], frame: pd.DataFrame) -> dict[int, Any]:
    keys = list(op["keys"])
    missing = [k for k in keys if k not in frame.columns]
    if missing:
        raise SavepointError(f"the new state lacks the key column(s) {missing}")
    where: dict[Any, int] = {}
    columns: list[str] | None = None
    for bucket, table in old.items():
        columns = list(table.columns)
        for key in table.index:
            where[key] = bucket
    indexed = frame.set_index(keys)
    if columns is not None:
        extra = [c for c in indexed.columns if c not in columns]
        if extra:
            raise SavepointError(f"the new state has column(s) {extra} that are not in the operator's state schema {columns}")
        indexed = indexed.reindex(columns=columns)
    _place_new_keys(spark, op, where, list(indexed.index))
    buckets = pd.Series([where[k] for k in indexed.index], index=indexed.index)
    out = {}
    for bucket, part in indexed.groupby(buckets.to_numpy()):
        part = part.copy()
        part.index.names = [None] * len(keys) if len(keys) > 1 else [None]
        out[int(bucket)] = part
    return out


def _timeout(blob: Any) -> int:
    """The group-state timeout Spark keeps beside a bucket: its earliest timer (event
    or processing time), which makes Spark call the bucket when it is due."""
    if isinstance(blob, dict):
        for kind in (_ET, _PT):
            if blob.get(kind):
                return int(blob[kind][0][0])
    return NO_TIMEOUT


class _Transform:
    """A ``scala.Function1[Dataset[Row], Dataset[Row]]`` implemented in Python (Py4J
    callback): Spark's StateRewriter calls it with each operator's state rows."""

    def __init__(self, spark: Any, rewrite: Callable[[Any], Any]) -> None:
        self.spark, self.rewrite = spark, rewrite

    def apply(self, jdf: Any) -> Any:
        from pyspark.sql import DataFrame

        return self.rewrite(DataFrame(jdf, self.spark))._jdf

    class Java:
        implements = ["scala.Function1"]


def _rewrite_checkpoint(spark: Any, checkpoint: str, batch: int, rewrite: Callable[[Any], Any]) -> None:
    """Append an empty micro-batch ``batch + 1`` to ``checkpoint`` whose state is
    each operator's state at ``batch`` passed through ``rewrite`` (a DataFrame of
    Spark's raw state rows -> the rows to store)."""
    from pyspark.java_gateway import ensure_callback_server_started

    for log in ("offsets", "commits"):
        shutil.copyfile(os.path.join(checkpoint, log, str(batch)), os.path.join(checkpoint, log, str(batch + 1)))
    os.remove(os.path.join(checkpoint, "commits", str(batch + 1)))  # committed once the state is written
    sc = spark.sparkContext
    ensure_callback_server_started(sc._gateway)
    jvm = sc._jvm
    none = jvm.scala.Option.apply(None)
    transform = jvm.scala.Some(_Transform(spark, rewrite))
    rewriter = jvm.org.apache.spark.sql.execution.streaming.state.StateRewriter(
        spark._jsparkSession, batch, batch + 1, checkpoint, sc._jsc.hadoopConfiguration(), none, transform, none
    )
    rewriter.run()
    shutil.copyfile(os.path.join(checkpoint, "commits", str(batch)), os.path.join(checkpoint, "commits", str(batch + 1)))


def write_state(spark: Any, path: str, operator: str, state: pd.DataFrame | Callable[[pd.DataFrame], pd.DataFrame], dest: str) -> dict[str, Any]:
    """A new savepoint at ``dest``: the one at ``path`` with operator ``operator``'s
    keyed state replaced by ``state`` — a DataFrame in :func:`read_state`'s layout, or
    a function from the current one to the new one (keys left out lose their state,
    new keys get state). Every other operator, the source positions and the job's
    metadata are unchanged. Returns the new savepoint's manifest."""
    manifest = verify(path)
    op_id, op = _operator(manifest, operator)
    if op["kind"] not in STATE_KINDS_WRITABLE:
        raise SavepointError(
            f"operator '{operator}' is a {op['kind']}: writing state is supported for "
            f"{' and '.join(STATE_KINDS_WRITABLE)}s (read_state shows any operator)"
        )
    frame = state(read_state(spark, path, operator)) if callable(state) else state
    if not isinstance(frame, pd.DataFrame):
        raise SavepointError(f"the new state must be a pandas DataFrame, got {type(frame).__name__}")
    old = _buckets(spark, path, manifest, op_id)
    if op["kind"] == VECTORISED:
        new = _new_vectorised_tables(spark, old, op, frame)
    else:
        new = _new_keyed_blobs(spark, old, op, frame)
    payload = {b: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for b, v in new.items()}
    batch = int(manifest["batch_id"])
    partitions = int(manifest.get("partitions") or spark.sparkContext.defaultParallelism)
    calls: list[int] = []
    wrong: list[str] = []

    def rewrite(df: Any) -> Any:
        # The rewriter visits operators in id order (checked: the key must be a bucket, and
        # every operator visited once); only ours changes.
        index = len(calls)
        calls.append(index)
        if index != op_id:
            return df
        from pyspark.sql import types as T

        key_type = df.schema["partition_key"].dataType if "partition_key" in df.schema.names else None
        if not isinstance(key_type, T.StructType) or key_type.names != ["__ember_bucket"]:
            wrong.append(str(key_type))  # not the operator we meant: leave it, fail below
            return df

        rows = [
            ({"__ember_bucket": b}, _encode_key(b), _encode_value(blob, _timeout(new[b])), "default")
            for b, blob in sorted(payload.items())
        ]
        # The rewriter writes the DataFrame's partition i into state partition i: place
        # each bucket where the job's hash partitioning by bucket looks for it.
        frame = spark.createDataFrame(rows, df.schema) if rows else spark.createDataFrame([], df.schema or T.StructType())
        return frame.repartition(partitions, "partition_key")

    with tempfile.TemporaryDirectory(prefix="ember-state-write-") as tmp:
        staging = os.path.join(tmp, "checkpoint")
        copy_into_checkpoint(path, staging)
        _rewrite_checkpoint(spark, staging, batch, rewrite)
        if wrong:
            raise SavepointError(
                f"Spark's state rewriter gave operator {op_id} with state key {wrong[0]}, not an Ember keyed "
                f"operator's bucket: the state was not written"
            )
        if len(calls) != len(manifest["pipeline"]["operators"]):
            raise SavepointError(
                f"Spark's state rewriter visited {len(calls)} operator(s), the savepoint has "
                f"{len(manifest['pipeline']['operators'])}: the state was not written"
            )
        info = {k: v for k, v in manifest.items() if k not in ("files", "batch_id", "partitions", "created", "format")}
        info["derived_from"] = {"savepoint": os.path.abspath(path), "batch_id": batch, "operator": operator}
        return cut_checkpoint(staging, dest, info, batch + 1)
