"""A savepoint's keyed state carried into another state layout (the runner's half;
``ember.savepoints.convert`` is the user's: what can be converted, and the manifest).

The blob and delta layouts live in different Spark state (``applyInPandasWithState``'s
one value per bucket, or ``transformWithStateInPandas``' value, list and timer families),
and Spark's state rewriter moves state between checkpoints of one plan, not between
operators. So a conversion starts a *new* query whose first micro-batch hands every keyed
step its state through ``transformWithStateInPandas``' ``initialState`` (Spark reads it in
micro-batch 0 only):

- the checkpoint keeps the savepoint's source positions and watermark as the offset-log
  entry of micro-batch 0 (not committed: Spark runs it on start), and its sources start
  there too (``checkpoint.start_offset``), so that batch reads nothing and the next goes on
  where the savepoint stopped — no input skipped or read twice;
- each keyed step's buckets, read from the savepoint in whatever layout it holds them, are
  written as the blob layout's dicts, pickled, one Parquet row per bucket
  (``CheckpointLayout.initial_state``); the step's processor writes them in its own layout
  and registers each bucket's earliest timer (keyed/tws.py ``handleInitialState``);
- the state, commit log and spooled side outputs of the old query are left behind.

The job's sinks fence their writes by job identity and batch id; a restored job has a new
identity (savepoints.restore_savepoint), so batch ids starting at 0 again write nothing twice.
"""

from __future__ import annotations

import os
import pickle
import shutil
from typing import Any

from ember.errors import RestartError
from ember.runner.spark.checkpoint import BY_SOURCE, CheckpointLayout, read_json, write_json
from ember.runner.spark.restart import state_buckets
from ember.runner.spark.state_io import bucket_states

__all__ = ["write_converted_checkpoint", "map_start_offsets", "streaming_source_ids", "STATE_COLUMN"]

STATE_COLUMN = "state"


def write_converted_checkpoint(spark: Any, checkpoint: str, batch: int,
                               steps: list[tuple[int, dict[str, Any], str]]) -> int:
    """Turn ``checkpoint`` — a copy of a savepoint cut at committed micro-batch ``batch`` — into
    a new query's checkpoint whose micro-batch 0 hands each keyed step in ``steps`` (its Spark
    operator id, its manifest entry in the savepoint, and its name in the pipeline restored)
    its state. Returns the buckets written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ember.runner.spark.translators.keyed import BUCKET

    layout = CheckpointLayout(checkpoint)
    written = 0
    for op_id, op, name in steps:  # (read before the old state goes)
        states = bucket_states(spark, checkpoint, batch, op_id, op)
        offset = int(op.get("lane") or 0) * state_buckets(op)  # a fan-out's lane: its operator's grouping keys
        table = pa.table({
            BUCKET: pa.array([b + offset for b in sorted(states)], pa.int32()),
            STATE_COLUMN: pa.array([pickle.dumps(states[b], protocol=pickle.HIGHEST_PROTOCOL) for b in sorted(states)],
                                   pa.binary()),
        })
        path = layout.initial_state(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table, path)
        written += len(states)
    with open(os.path.join(checkpoint, "offsets", str(batch))) as f:
        entry = f.read()
    for folder in ("state", "commits", "offsets", os.path.join(layout.ember_dir, "spool")):
        shutil.rmtree(os.path.join(checkpoint, folder), ignore_errors=True)
    os.makedirs(os.path.join(checkpoint, "offsets"))
    with open(os.path.join(checkpoint, "offsets", "0"), "w") as f:
        f.write(entry)  # "v1", the metadata (watermark, settings), one offset per source
    write_json(layout.start_offsets, {"offsets": entry.splitlines()[2:], "savepoint batch": batch})
    return written


def streaming_source_ids(df: Any) -> list[str | None]:
    """The Ember source id (``checkpoint.SOURCE_ID_OPTION``) of each streaming source of
    ``df``'s plan, in the order Spark logs their offsets (its plan's leaves, depth first, a
    source read twice listed twice); None for a source that is not one of Ember's."""
    from ember.runner.spark.checkpoint import SOURCE_ID_OPTION

    out: list[str | None] = []
    leaves = df._jdf.queryExecution().analyzed().collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        kind = leaf.getClass().getSimpleName()
        if kind == "StreamingRelationV2":
            value = leaf.extraOptions().get(SOURCE_ID_OPTION)
            out.append(str(value) if value is not None else None)
        elif kind.startswith("Streaming"):  # (a v1 source: Spark's file source)
            out.append(None)
    return out


def map_start_offsets(df: Any, checkpoint: str) -> None:
    """Name each source's start position in a converted checkpoint (``start-offsets.json``:
    the savepoint's offsets in Spark's order, to ``{source id: offset}``) before its query
    starts (a source's id is its step's name)."""
    layout = CheckpointLayout(checkpoint)
    spec = read_json(layout.start_offsets) or {}
    offsets = list(spec.get("offsets") or [])
    ids = streaming_source_ids(df)
    if len(ids) != len(offsets):
        raise RestartError(
            f"the converted checkpoint {checkpoint} holds positions for {len(offsets)} source(s) and this "
            f"pipeline's query reads {len(ids)}: restore the savepoint with the pipeline that wrote it")
    by_source: dict[str, str] = {}
    for sid, offset in zip(ids, offsets):
        if sid is None:
            raise RestartError(
                "a source of this pipeline is read by Spark's own reader, which cannot start at a savepoint's "
                "position: a converted checkpoint needs Ember's sources")
        if by_source.setdefault(sid, offset) != offset:
            raise RestartError(f"source '{sid}' is read twice in the query with two different positions")
    spec[BY_SOURCE] = by_source
    write_json(layout.start_offsets, spec)
