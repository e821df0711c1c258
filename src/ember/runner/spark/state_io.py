"""Reading, writing and rescaling the state of a stopped checkpoint (the runner's
half of the State Processor API; ``ember.savepoints`` is the user's half: it
verifies savepoints, stages copies and cuts new ones).

Operators are addressed as Spark numbers them (``op_id``) and described by
their entry in the pipeline manifest (``restart.pipeline_manifest``: name, kind,
key fields and, from ``ember/operators.json``, their Spark types).

Reading uses Spark's state data source (``spark.read.format("statestore")``)
and decodes Ember's layout: a keyed operator keeps one value per state bucket,
the bucket's keys and their states pickled together (runner/spark/keyed/runtime.py, bucket.py),
so a bucket row becomes one row per (key, state name). Spark's own operators
(native window aggregations) are shown as Spark stores them, key and value
fields flattened.

Writing uses Spark's offline state rewriter (``StateRewriter``, the machinery
behind Spark 4.3's state repartitioning): the savepoint is copied to a staging
checkpoint, an empty micro-batch N + 1 is appended to its logs (same source
offsets: no input is skipped or repeated), and the rewriter writes state
version N + 2 of every operator — unchanged, except the one being written,
whose rows Ember computes on the driver. (The caller stages the copy and cuts
the result into a new savepoint.) The state store rows are Spark UnsafeRows; Ember's
keyed operators have a fixed layout (key: the int bucket; value: one binary
field and the group-state timeout), which :func:`_encode_value` writes. A step on
the delta layout (keyed/delta.py) gets each bucket's table as its log's only part
under a new version (:func:`_delta_rows`).
"""

from __future__ import annotations

import copy
import heapq
import os
import pickle
import shutil
import struct
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import functions as F

from ember.errors import SavepointError
from ember.runner.spark.keyed.runtime import BROADCAST, EVENT_TIMERS, PROCESSING_TIMERS, empty_bucket_state
from ember.runner.spark.placement import TWS
from ember.runner.spark.restart import state_buckets
from ember.runner.spark.translators.keyed import bucket_of

__all__ = ["read_operator_state", "read_broadcast_state", "write_operator_state", "check_writable", "rescale_checkpoint",
           "bucket_states", "STATE_KINDS_WRITABLE"]

KEYED = ("process function", "window", "broadcast process function", "window join", "keyed interval join")  # read as key, state, value rows
VECTORISED = "vectorised process function"
STATE_KINDS_WRITABLE = ("process function", VECTORISED)
NO_TIMEOUT = -1


def _state_frame(spark: Any, checkpoint: str, batch_id: int, op_id: int, variable: str | None = None) -> Any:
    """Operator ``op_id``'s state rows at ``batch_id`` (Spark's state data source); of a
    ``transformWithStateInPandas`` operator, its state ``variable`` (a list as one array per
    key, in its order)."""
    reader = spark.read.format("statestore").option("batchId", int(batch_id)).option("operatorId", op_id)
    if variable is not None:
        reader = reader.option("stateVarName", variable).option("flattenCollectionTypes", "false")
    return reader.load(checkpoint)


def _buckets(spark: Any, checkpoint: str, batch_id: int, op_id: int, tws: bool = False) -> dict[int, Any]:
    """bucket -> its unpickled state (Ember's keyed operators; the checkpoint is the job's own).
    ``tws``: the operator is a ``transformWithStateInPandas`` (keyed/tws.py: the blob is its
    ``blob`` value state), else an ``applyInPandasWithState``."""
    out = {}
    if tws:
        for row in _state_frame(spark, checkpoint, batch_id, op_id, "blob").collect():
            out[int(row["key"][0])] = pickle.loads(bytes(row["value"][0]))
        return out
    for row in _state_frame(spark, checkpoint, batch_id, op_id).collect():
        blob = row["value"]["groupState"][0]
        out[int(row["key"][0])] = pickle.loads(blob)
    return out


def _delta_buckets(spark: Any, checkpoint: str, batch_id: int, op_id: int, vectorised: bool,
                   metas: dict[int, Any] | None = None) -> dict[int, Any]:
    """bucket -> its state on design B (keyed/delta.py): the log's parts folded, as the
    vectorised table (a DataFrame indexed by key) or, for a process function, the blob
    layout's ``{"keys": {key: slot}}`` (the overflow of collided keys included). ``metas``:
    the process function's buckets' blob values (``_buckets(..., tws=True)``), if read already."""
    from ember.runner.spark.keyed.delta import BINARY, DELETED, KEY, OVERFLOW, decode_part, fold_parts

    parts: dict[int, list[bytes]] = {}  # each bucket's log, in its order (the order matters)
    for row in _state_frame(spark, checkpoint, batch_id, op_id, "parts").collect():
        parts.setdefault(int(row["key"][0]), []).extend(bytes(v[0]) for v in row["list_value"])
    out: dict[int, Any] = {}
    if vectorised:
        for bucket, blobs in parts.items():
            first = decode_part(blobs[0])  # the state fields and their types, as the parts carry them
            fields = [f for f in first.schema.names if f not in (KEY, DELETED)]
            types = [first.column(f).to_numpy(zero_copy_only=False).dtype for f in fields]
            keys, columns = fold_parts(blobs, fields, types)
            out[bucket] = pd.DataFrame(dict(zip(fields, columns)), index=pd.Index(keys))
        return out
    if metas is None:  # each bucket's blob value (keys aside)
        metas = _buckets(spark, checkpoint, batch_id, op_id, tws=True)
    for bucket in set(parts) | set(metas):
        table: dict[Any, Any] = {}
        if bucket in parts:
            _hashes, (slots,) = fold_parts(parts[bucket], ["slot"], [BINARY])
            for blob in slots.to_pylist():
                key, slot = pickle.loads(blob)
                table[key] = slot
        table.update(metas.get(bucket, {}).get(OVERFLOW, {}))
        out[bucket] = {"keys": table}
    return out


def read_operator_state(spark: Any, checkpoint: str, batch_id: int, op_id: int, op: dict[str, Any]) -> pd.DataFrame:
    """Operator ``op_id``'s state in ``checkpoint`` at committed batch ``batch_id``, one
    layout per operator kind (documented for users at ``ember.savepoints.state.read_state``);
    a step on design B (``"state layout": "delta"``) reads as the same frame."""
    keys = list(op["keys"])
    delta = op.get("state layout") == "delta"
    tws = _on_tws(op)
    if op["kind"] in KEYED:
        rows = []
        buckets = _delta_buckets(spark, checkpoint, batch_id, op_id, False) if delta else _buckets(spark, checkpoint, batch_id, op_id, tws)
        buckets = _lane(buckets, op)
        for blob in buckets.values():
            for key, slot in blob["keys"].items():
                key_values = list(key) if len(keys) != 1 else [key]  # (no key fields: the one key ())
                rows += [[*key_values, name, value] for name, value in slot.items() if name not in (EVENT_TIMERS, PROCESSING_TIMERS)]
        frame = pd.DataFrame(rows, columns=[*keys, "state", "value"])
        return frame.sort_values([*keys, "state"], ignore_index=True) if len(frame) else frame
    if op["kind"] == VECTORISED:
        buckets = _delta_buckets(spark, checkpoint, batch_id, op_id, True) if delta else _buckets(spark, checkpoint, batch_id, op_id, tws)
        buckets = _lane(buckets, op)
        tables = [t for t in buckets.values() if len(t)]
        if not tables:
            return pd.DataFrame(columns=keys)
        table = pd.concat(tables)
        table.index.names = keys
        return table.reset_index().sort_values(keys, ignore_index=True)
    return _state_frame(spark, checkpoint, batch_id, op_id).select("key.*", "value.*").toPandas()


def read_broadcast_state(spark: Any, checkpoint: str, batch_id: int, op_id: int, op: dict[str, Any]) -> dict[str, dict]:
    """A broadcast step's broadcast state at committed batch ``batch_id``: ``{state name:
    {key: value}}``. Every state bucket holds the same copy (keyed/broadcast.py); the one of
    the lowest bucket holding any is returned ({} before the first broadcast record)."""
    if op["kind"] != "broadcast process function":
        raise SavepointError(f"operator '{op['name']}' ({op['kind']}) has no broadcast state")
    # (on the delta layout, always on TWS, the "blob" value holds the bucket's blob but its keys)
    buckets = _buckets(spark, checkpoint, batch_id, op_id, _on_tws(op))
    copies = [blob[BROADCAST] for _, blob in sorted(_lane(buckets, op).items()) if BROADCAST in blob]
    return {name: dict(entries) for name, entries in copies[0].items()} if copies else {}


# -- writing -----------------------------------------------------------------------------


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def _encode_key(bucket: int) -> bytes:
    """UnsafeRow of struct<__ember_bucket: int>: null bits, one 8-byte slot."""
    return struct.pack("<qi4x", 0, bucket)


def _encode_binary_row(payload: bytes) -> bytes:
    """UnsafeRow of struct<one binary> (a transformWithStateInPandas value state's value)."""
    return struct.pack("<qq", 0, (16 << 32) | len(payload)) + payload + b"\0" * (_pad8(len(payload)) - len(payload))


def _encode_value(payload: bytes, timeout: int | None) -> bytes:
    """UnsafeRow of struct<groupState: struct<one binary>, timeoutTimestamp: bigint>, or of
    struct<groupState: struct<one binary>> (``timeout`` None: a step without Spark's group
    timeout, translators/keyed.py)."""
    inner = _encode_binary_row(payload)
    if timeout is None:  # one variable-length field, as a binary row (inner is 8-byte aligned)
        return _encode_binary_row(inner)
    return struct.pack("<qqq", 0, (24 << 32) | len(inner), timeout) + inner


def _keeps_timeout(spark: Any, checkpoint: str, batch_id: int, op_id: int) -> bool:
    """Whether an ``applyInPandasWithState`` operator's state rows carry the group timeout."""
    value = _state_frame(spark, checkpoint, batch_id, op_id).schema["value"].dataType
    return "timeoutTimestamp" in value.names


def _place_new_keys(spark: Any, op: dict[str, Any], where: dict[Any, int], keys: list[Any]) -> None:
    """Add the state bucket of each key in ``keys`` (not yet in ``where``) to ``where``,
    computed by Spark with the job's own bucket expression and key types."""
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
    where.update(zip(new, (int(r[0]) for r in df.select(bucket_of(tuple(names), state_buckets(op))).collect())))


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
        key = tuple(record[: len(keys)]) if len(keys) != 1 else record[0]  # (no key fields: the one key ())
        slots.setdefault(key, {})[record[-2]] = record[-1]
    _place_new_keys(spark, op, where, list(slots))
    blobs: dict[int, Any] = {b: empty_bucket_state() for b in set(old) | {where[k] for k in slots}}
    for key, states in slots.items():
        timers = {n: t for n, t in old_slots.get(key, {}).items() if n in (EVENT_TIMERS, PROCESSING_TIMERS)}  # a kept key keeps its timers
        blobs[where[key]]["keys"][key] = {**states, **timers}
    for blob in blobs.values():
        _queues_from_slots(blob)
    shared = next((blob[BROADCAST] for blob in old.values() if BROADCAST in blob), None)
    if shared is not None:  # a broadcast step: every bucket keeps its copy of the broadcast state
        for blob in blobs.values():
            blob[BROADCAST] = copy.deepcopy(shared)
    return {b: blob for b, blob in blobs.items() if blob["keys"] or BROADCAST in blob}


def _queues_from_slots(blob: dict[str, Any]) -> None:
    """Push each key's timers (its slot's) onto the bucket's queues, numbered after ``n``."""
    for key, slot in blob["keys"].items():
        for kind in (EVENT_TIMERS, PROCESSING_TIMERS):
            for ts in sorted(slot.get(kind, ())):
                blob["n"] += 1
                heapq.heappush(blob[kind], (int(ts), blob["n"], key))


def bucket_states(spark: Any, checkpoint: str, batch_id: int, op_id: int, op: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each state bucket of keyed step ``op`` (a process function, Python window or vectorised
    step; a fan-out's lane: its own buckets, numbered as alone) at committed ``batch_id``, as the blob layout keeps
    it — whichever layout the checkpoint holds: ``{"keys": {key: slot}, timer queues, "n",
    ...}``, or a vectorised step's table (a DataFrame indexed by key). A bucket
    of the delta layout gets its queues rebuilt from its keys' slots (as its working copy
    does, keyed/tws.py SlotBlob); what a converted checkpoint hands the step (conversion.py)."""
    from ember.runner.spark.keyed.delta import OVERFLOW
    from ember.runner.spark.keyed.tws import VERSION

    if op.get("state layout") != "delta":
        return _lane(_buckets(spark, checkpoint, batch_id, op_id, _on_tws(op)), op)
    if op["kind"] == VECTORISED:
        return _lane(_delta_buckets(spark, checkpoint, batch_id, op_id, True), op)
    metas = _buckets(spark, checkpoint, batch_id, op_id, tws=True)  # (the operator's: read once, laned below)
    laned = _lane(metas, op)
    out = {}
    for bucket, table in _lane(_delta_buckets(spark, checkpoint, batch_id, op_id, False, metas), op).items():
        meta = laned.get(bucket) or empty_bucket_state()
        blob = {k: v for k, v in meta.items() if k not in (VERSION, OVERFLOW)}
        blob.update({"keys": table["keys"], EVENT_TIMERS: [], PROCESSING_TIMERS: [], "n": int(meta.get("n", 0))})
        _queues_from_slots(blob)
        out[bucket] = blob
    return out


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
        for kind in (EVENT_TIMERS, PROCESSING_TIMERS):
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


# -- writing the delta layout (keyed/delta.py) ------------------------------------------------

# Spark 4.3 keeps a ListState as one row per element plus a count per key in a
# "$rowCounter_<name>" column family (seen in the rewriter's rows); both are written.
DELTA_FAMILIES = ("parts", "$rowCounter_parts")


def _encode_count(n: int) -> bytes:
    """UnsafeRow of struct<one bigint> (a ListState's element count)."""
    return struct.pack("<qq", 0, n)


def _encode_version(row: tuple[Any, ...]) -> bytes:
    """UnsafeRow of keyed/delta.py ``Version.SCHEMA``: struct<tag string, parts, logged, live bigint>."""
    tag = str(row[0]).encode()
    fixed = 8 + 4 * 8
    return struct.pack("<qqqqq", 0, (fixed << 32) | len(tag), *(int(v) for v in row[1:])) + tag + b"\0" * (_pad8(len(tag)) - len(tag))


_KIND_ALIASES = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint", "bool": "boolean"}


def _delta_state_types(op: dict[str, Any], old: dict[int, Any]) -> tuple[list[str], list[Any]]:
    """A vectorised step's state fields and their numpy types: from its ``state_schema`` in the
    manifest when that is DDL (the layout keeps numbers only), else from the tables its log holds."""
    from ember.runner.spark.keyed.delta import NUMERIC_KINDS, numpy_types

    schema = str(op.get("state", {}).get("state schema") or "")
    pairs = [field.split() for field in schema.split(",")]
    if all(len(p) == 2 for p in pairs):
        kinds = [_KIND_ALIASES.get(p[1].lower(), p[1].lower()) for p in pairs]
        if all(k in NUMERIC_KINDS for k in kinds):
            return [p[0].strip("`") for p in pairs], numpy_types(kinds)
    table = next(iter(old.values()), None)
    if table is None:
        raise SavepointError(f"operator '{op['name']}': neither the savepoint nor its state says the state's types")
    return list(table.columns), [table[c].dtype.type for c in table.columns]


def _delta_rows(op: dict[str, Any], new: dict[int, Any], old: dict[int, Any]) -> list[tuple[int, str, bytes]]:
    """The state-store rows ``(bucket, column family, value)`` of buckets whose state is
    ``new`` on design B: per bucket its live table as the log's only part(s) (a compacted
    log), their count, and a version with a new tag — every executor's working copy of the
    bucket then differs from it and is rebuilt from this log on first use. A process
    function's bucket keeps its version and collided keys in its ``blob``."""
    from ember.runner.spark.keyed.delta import BINARY, OVERFLOW, PART_ROWS, encode_part, key_hashes, new_tag
    from ember.runner.spark.keyed.tws import VERSION

    vectorised = op["kind"] == VECTORISED
    fields, types = _delta_state_types(op, old) if vectorised else (["slot"], [BINARY])
    rows: list[tuple[int, str, bytes]] = []
    for bucket, state in sorted(new.items()):
        overflow: dict[Any, Any] = {}
        if vectorised:
            keys = state.index.to_numpy().astype("int64")
            order = keys.argsort(kind="stable")
            keys = keys[order]
            columns = []
            for name, kind in zip(fields, types):
                values = state[name].to_numpy()[order]
                if pd.isna(values).any():
                    raise SavepointError(f"operator '{op['name']}': state field '{name}' is null for some keys; "
                                         "leave a key out to remove its state")
                columns.append(values.astype(kind))
        else:
            entries: dict[int, bytes] = {}
            slots = state["keys"]
            for (key, slot), h in zip(slots.items(), key_hashes(list(slots)).tolist() if slots else ()):
                if h in entries:  # another key owns this hash's entry: the bucket's overflow keeps it
                    overflow[key] = slot
                else:
                    entries[h] = pickle.dumps((key, slot), protocol=pickle.HIGHEST_PROTOCOL)
            hashes = sorted(entries)
            keys = np.array(hashes, dtype=np.int64)
            columns = [pa.array([entries[h] for h in hashes], pa.binary())]
        live = len(keys)
        parts = [encode_part(keys[i:i + PART_ROWS], [c[i:i + PART_ROWS] for c in columns],
                             np.zeros(min(PART_ROWS, live - i), bool), fields) for i in range(0, max(live, 1), PART_ROWS)]
        rows += [(bucket, "parts", _encode_binary_row(p)) for p in parts]
        rows.append((bucket, "$rowCounter_parts", _encode_count(len(parts))))
        version = (new_tag(), len(parts), live, live)
        if vectorised:
            rows.append((bucket, "version", _encode_version(version)))
        else:
            # (no timer queues: the slots hold each key's timers, and the new tag makes every
            # executor rebuild its queues from them, keyed/delta.py SlotTable.rebuild_timers)
            meta = {**state, "keys": {}, EVENT_TIMERS: [], PROCESSING_TIMERS: [], OVERFLOW: overflow, VERSION: version}
            rows.append((bucket, "blob", _encode_binary_row(pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL))))
    return rows


def _lane(buckets: dict[int, Any], op: dict[str, Any]) -> dict[int, Any]:
    """The buckets of ``op`` among its Spark operator's: a fan-out's lane (``"lane"``) holds
    the grouping keys ``lane * buckets + bucket`` (keyed/lanes.py; ``buckets``: the job's
    ``max_parallelism``)."""
    lane, stride = op.get("lane"), state_buckets(op)
    if lane is None:
        return buckets
    return {k - lane * stride: v for k, v in buckets.items() if k // stride == lane}


def _on_tws(op: dict[str, Any]) -> bool:
    """Whether operator ``op`` (its manifest entry) runs on ``transformWithStateInPandas`` (a
    job with several keyed steps, a fan-out's lanes among them), not ``applyInPandasWithState``."""
    return "lane" in op or op.get("spark operator") == TWS


def check_writable(op: dict[str, Any]) -> None:
    """Raise unless the state of operator ``op`` (its manifest entry) can be written."""
    if op["kind"] not in STATE_KINDS_WRITABLE:
        raise SavepointError(
            f"operator '{op['name']}' is a {op['kind']}: writing state is supported for "
            f"{' and '.join(STATE_KINDS_WRITABLE)}s (read_state shows any operator)"
        )


def write_operator_state(
    spark: Any, checkpoint: str, batch_id: int, op_id: int, op: dict[str, Any], n_operators: int,
    partitions: int, frame: pd.DataFrame,
) -> None:
    """Append an empty micro-batch ``batch_id + 1`` to the (staging) ``checkpoint``
    in which operator ``op_id``'s keyed state is ``frame`` (:func:`read_operator_state`'s
    layout: keys left out lose their state, new keys get state) and every other
    operator's state is unchanged. ``n_operators``: the job's stateful operators
    (each must be visited once by Spark's rewriter); ``partitions``: its state partitions."""
    check_writable(op)
    tws = _on_tws(op)
    delta = op.get("state layout") == "delta"
    vectorised = op["kind"] == VECTORISED
    if delta:
        old = _lane(_delta_buckets(spark, checkpoint, batch_id, op_id, vectorised), op)
    else:
        old = _lane(_buckets(spark, checkpoint, batch_id, op_id, tws), op)
    new = _new_vectorised_tables(spark, old, op, frame) if vectorised else _new_keyed_blobs(spark, old, op, frame)
    if delta:
        delta_rows = _delta_rows(op, new, old)
    else:
        payload = {b: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for b, v in new.items()}
    timeouts = not tws and _keeps_timeout(spark, checkpoint, batch_id, op_id)
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

        if tws:  # the "blob" value state's rows of this step's buckets (a lane's: offset by the lane)
            offset = int(op.get("lane") or 0) * state_buckets(op)
            if delta:  # its log, the log's row counts and its version (or blob), rewritten whole
                families = [*DELTA_FAMILIES, "version" if vectorised else "blob"]
                rows = [({"__ember_bucket": b + offset}, _encode_key(b + offset), value, family)
                        for b, family, value in delta_rows]
            else:
                families = ["blob"]
                rows = [({"__ember_bucket": b + offset}, _encode_key(b + offset), _encode_binary_row(blob), "blob")
                        for b, blob in sorted(payload.items())]
            bucket = F.col("partition_key.__ember_bucket")
            mine = F.col("column_family_name").isin(families) & (bucket >= offset) & (bucket < offset + state_buckets(op))
            kept = df.filter(~mine)  # other lanes' buckets, and the timers Spark keeps for the step's buckets
            rewritten = kept.unionByName(spark.createDataFrame(rows, df.schema)) if rows else kept
        else:
            rows = [
                ({"__ember_bucket": b}, _encode_key(b), _encode_value(blob, _timeout(new[b]) if timeouts else None), "default")
                for b, blob in sorted(payload.items())
            ]
            rewritten = spark.createDataFrame(rows, df.schema) if rows else spark.createDataFrame([], df.schema or T.StructType())
        # The rewriter writes the DataFrame's partition i into state partition i: place
        # each bucket where the job's hash partitioning by bucket looks for it.
        return rewritten.repartition(partitions, "partition_key")

    _rewrite_checkpoint(spark, checkpoint, batch_id, rewrite)
    if wrong:
        raise SavepointError(
            f"Spark's state rewriter gave operator {op_id} with state key {wrong[0]}, not an Ember keyed "
            f"operator's bucket: the state was not written"
        )
    if len(calls) != n_operators:
        raise SavepointError(
            f"Spark's state rewriter visited {len(calls)} operator(s), the job has {n_operators}: "
            "the state was not written"
        )


def rescale_checkpoint(spark: Any, checkpoint: str, parallelism: int) -> None:
    """Repartition a stopped checkpoint's state to ``parallelism`` state partitions
    (Spark 4.3's offline repartitioning: it appends a batch that rewrites every
    operator's state under the new partitioning)."""
    try:
        spark._jsparkSession.streamingCheckpointManager().repartition(checkpoint, int(parallelism), True)
    except Exception as exc:  # noqa: BLE001 - Spark's error, reworded
        text = str(getattr(exc, "desc", None) or exc).splitlines()[0]
        raise SavepointError(f"rescaling the state to {parallelism} partitions failed: {text}") from exc
