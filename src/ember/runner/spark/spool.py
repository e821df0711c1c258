"""Detoured side outputs: records that leave the streaming query beside it.

A ``parse_json`` step whose decoded records feed a stateful step (a window) — or
a ``map``, ``flat_map`` or ``filter`` whose records do — cannot also hand its dead
letters to a second sink inside the query: Spark
runs one streaming plan per query, and Ember's split of a query into several
sinks happens per micro-batch, after every stateful step (planner.py: the
split). So the step's task *spools* its dead letters instead: one
Parquet file per (micro-batch, Spark partition) under the job's checkpoint,

    <checkpoint>/ember/spool/<step>/<batch id>/part-<partition>.parquet

written atomically (temporary file, then rename). After the micro-batch's
other sinks are written, the driver reads the batch's files, writes the
detoured branch to its sinks under the same batch id, and deletes them.

Exactly once: a micro-batch that is replayed after a crash recomputes the same
tasks over the same input (replayable sources, deterministic steps), which
write the same files again; the sinks fence their writes by batch id, so each
dead letter reaches an exactly-once sink once. The checkpoint must be on
storage every executor sees (as Spark requires anyway).
"""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any

import pyarrow as pa

__all__ = ["write_spool", "write_dead_letters", "read_spool", "clear_spool"]

_BATCH_ID = "streaming.sql.batchId"  # the local property Spark sets on every task of a micro-batch


def write_spool(directory: str, table: pa.Table) -> None:
    """On a worker: this task's side-output rows of the current micro-batch."""
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = context.getLocalProperty(_BATCH_ID) if context is not None else None
    if context is None or batch is None:
        raise RuntimeError("a spooled side output was computed outside a streaming micro-batch")
    target = os.path.join(directory, str(batch))
    os.makedirs(target, exist_ok=True)
    path = os.path.join(target, f"part-{context.partitionId():05d}.parquet")
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_dead_letters(directory: str, raw: pa.Array | list[str], errors: list[str]) -> None:
    """On a worker: this task's dead letters (``raw``, ``error``) of the current micro-batch."""
    raw = raw if isinstance(raw, pa.Array) else pa.array(raw, pa.string())
    write_spool(directory, pa.table({"raw": raw, "error": pa.array(errors, pa.string())}))


def read_spool(spark: Any, directory: str, batch_id: int) -> Any | None:
    """On the driver: the spooled rows of micro-batch ``batch_id`` (None when there are none)."""
    target = os.path.join(directory, str(batch_id))
    if not os.path.isdir(target) or not any(f.endswith(".parquet") for f in os.listdir(target)):
        return None
    return spark.read.parquet(os.path.join(target, "*.parquet"))


def clear_spool(directory: str, batch_id: int) -> None:
    """Deletes the spool of micro-batch ``batch_id`` and of every earlier one."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name.isdigit() and int(name) <= batch_id:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
