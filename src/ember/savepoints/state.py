"""A small State Processor API: read an operator's state from a savepoint as a
pandas DataFrame, and write a modified state into a new savepoint.

This module handles the savepoint side — verification, a staging copy, the cut
of the new savepoint with its provenance — and leaves Spark to the runner
(``ember.runner.spark.state_io``: Spark's state data source to read, its offline
``StateRewriter`` to write, and Ember's keyed state layout).

Writing: the savepoint is copied to a staging checkpoint, an empty micro-batch
N + 1 is appended to its logs (same source offsets: no input is skipped or
repeated) with every operator's state unchanged except the one written, and
the staging checkpoint is cut into the new savepoint at N + 1.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable

import pandas as pd

from ember.errors import SavepointError
from ember.runner.spark.restart import spark_operator_count, spark_operator_ids
from ember.runner.spark.state_io import (
    STATE_KINDS_WRITABLE,
    check_writable,
    read_operator_state,
    write_operator_state,
)
from ember.runner.spark.state_io import (
    read_broadcast_state as _read_broadcast,
)
from ember.savepoints.store import copy_into_checkpoint, cut_checkpoint, verify

__all__ = ["read_state", "read_broadcast_state", "write_state", "STATE_KINDS_WRITABLE"]


def _operator(manifest: dict[str, Any], name: str) -> tuple[int, dict[str, Any]]:
    ops = manifest["pipeline"]["operators"]
    for i, op in zip(spark_operator_ids(ops), ops):
        if op["name"] == name:
            if op.get("spark operators") == 0:
                raise SavepointError(f"the SQL step '{name}' holds no state: Spark plans no stateful operator for its query")
            return i, op
    known = ", ".join(f"'{o['name']}'" for o in ops) or "none"
    raise SavepointError(f"the savepoint has no stateful operator '{name}' (it has: {known})")


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
    return read_operator_state(spark, path, int(manifest["batch_id"]), op_id, op)


def read_broadcast_state(spark: Any, path: str, operator: str) -> dict[str, dict]:
    """The broadcast state of the broadcast step ``operator`` in the savepoint at ``path``
    (verified first): ``{state name: {key: value}}``, the copy every task holds."""
    manifest = verify(path)
    op_id, op = _operator(manifest, operator)
    return _read_broadcast(spark, path, int(manifest["batch_id"]), op_id, op)


def write_state(
    spark: Any, path: str, operator: str, state: pd.DataFrame | Callable[[pd.DataFrame], pd.DataFrame], dest: str
) -> dict[str, Any]:
    """A new savepoint at ``dest``: the one at ``path`` with operator ``operator``'s
    keyed state replaced by ``state`` — a DataFrame in :func:`read_state`'s layout, or
    a function from the current one to the new one (keys left out lose their state,
    new keys get state). Every other operator, the source positions and the job's
    metadata are unchanged. Returns the new savepoint's manifest."""
    manifest = verify(path)
    op_id, op = _operator(manifest, operator)
    check_writable(op)  # before the current state is read for a function of it
    batch = int(manifest["batch_id"])
    frame = state(read_operator_state(spark, path, batch, op_id, op)) if callable(state) else state
    if not isinstance(frame, pd.DataFrame):
        raise SavepointError(f"the new state must be a pandas DataFrame, got {type(frame).__name__}")
    operators = spark_operator_count(manifest["pipeline"]["operators"])
    partitions = int(manifest.get("partitions") or spark.sparkContext.defaultParallelism)
    with tempfile.TemporaryDirectory(prefix="ember-state-write-") as tmp:
        staging = os.path.join(tmp, "checkpoint")
        copy_into_checkpoint(path, staging)
        write_operator_state(spark, staging, batch, op_id, op, operators, partitions, frame)
        info = {k: v for k, v in manifest.items() if k not in ("files", "batch_id", "partitions", "created", "format")}
        info["derived_from"] = {"savepoint": os.path.abspath(path), "batch_id": batch, "operator": operator}
        return cut_checkpoint(staging, dest, info, batch + 1)
