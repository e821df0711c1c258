"""Savepoints: stop, version, inspect, modify, rescale and restore a job's state.

- :func:`create_savepoint` — an addressable copy of a job's consistent state at
  a committed micro-batch; with ``stop=True`` the running job first stops at a
  clean cut (stop-with-savepoint: nothing processed twice or lost across the switch).
- ``env.execute(..., from_savepoint=path)`` / ``ember run --from-savepoint`` —
  start a (possibly changed, possibly rescaled) pipeline from it (:func:`restore_savepoint`).
- :class:`Savepoint` — inspect one, read an operator's state as a pandas
  DataFrame, write a modified state into a new savepoint.

Layout and guarantees: store.py; reading and writing state: state.py (Spark's
side of both lives in the runner: runner/spark/checkpoint.py, state_io.py);
design: docs/design/savepoints.md; guide: docs/savepoints.md.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import sys
import time
from typing import Any, Callable

import pandas as pd

from ember.errors import RestartError, SavepointError
from ember.graph.graph import Graph
from ember.job import EnvironmentConfig, default_max_parallelism
from ember.runner.spark.checkpoint import EMBER_DIR, CheckpointLayout, batch_conf, last_batch, offset_log_entry, read_json, write_json
from ember.runner.spark.conversion import write_converted_checkpoint
from ember.runner.spark.restart import compare, pipeline_manifest, spark_operator_ids, stored_max_parallelism
from ember.runner.spark.state_io import rescale_checkpoint
from ember.savepoints.convert import as_converted, check_convertible, converted_manifest, layout_changes
from ember.savepoints.state import read_broadcast_state, read_state, write_state
from ember.savepoints.store import (
    SavepointInfo,
    copy_into_checkpoint,
    cut_checkpoint,
    delete_savepoint,
    list_savepoints,
    verify,
)
from ember.time.clock import Clock, SystemClock
from ember.version import __version__ as ember_version

__all__ = [
    "Savepoint",
    "SavepointError",
    "SavepointInfo",
    "create_savepoint",
    "restore_savepoint",
    "list_savepoints",
    "delete_savepoint",
    "DEFAULT_ROOT",
]

DEFAULT_ROOT = "ember-savepoints"
_CHECKPOINT_ENTRIES = {EMBER_DIR, "offsets", "commits", "state", "sources", "metadata", ".metadata.crc"}


def _alive(info: dict[str, Any]) -> bool:
    """Is the job that wrote this ``running`` marker still running (as far as we can tell)?"""
    if info.get("host") != socket.gethostname():
        return True  # another machine's process: trust the marker
    try:
        os.kill(int(info["pid"]), 0)
    except (ProcessLookupError, ValueError, KeyError):
        return False
    except PermissionError:
        return True
    return True


def _stop_job(checkpoint: str, timeout_s: float, progress: Callable[[str], None], clock: Clock) -> bool:
    """Ask the job running on ``checkpoint`` to stop at a clean cut and wait for it;
    False when no job was running."""
    layout = CheckpointLayout(checkpoint)
    running = layout.running
    info = read_json(running)
    if info is None or not _alive(info):
        return False
    open(layout.stop_request, "a").close()
    progress(f"asked job '{info.get('job', '?')}' (pid {info.get('pid')}) to stop at a clean cut ...")
    deadline = clock.monotonic() + timeout_s
    while os.path.exists(running):
        current = read_json(running)
        if current is not None and not _alive(current):
            break
        if clock.monotonic() > deadline:
            raise SavepointError(f"the job did not stop within {timeout_s:g} s; no savepoint was taken")
        clock.sleep(0.1)
    return True


def _describe_job(checkpoint: str, job: str | None) -> dict[str, Any]:
    from pyspark import __version__ as spark_version

    layout = CheckpointLayout(checkpoint)
    pipeline = read_json(layout.pipeline)
    if pipeline is None:
        raise SavepointError(f"{checkpoint} is not an Ember job's checkpoint (no ember/pipeline.json)")
    compiled = read_json(layout.operators) or {}
    types, counts = compiled.get("key_types", {}), compiled.get("spark_operators", {})
    for op in pipeline.get("operators", []):
        if op["name"] in types:
            op["key_types"] = types[op["name"]]
        if op["name"] in counts:  # a SQL step: how many stateful operators Spark plans for its query
            op["spark operators"] = counts[op["name"]]
    return {
        "job": job or os.path.basename(os.path.normpath(checkpoint)),
        "checkpoint": os.path.abspath(checkpoint),
        "pipeline": pipeline,
        "spark_version": spark_version,
        "ember_version": ember_version,
    }


def create_savepoint(
    checkpoint: str,
    dest: str | None = None,
    *,
    root: str = DEFAULT_ROOT,
    stop: bool = False,
    job: str | None = None,
    timeout_s: float = 300.0,
    progress: Callable[[str], None] = lambda _: None,
    clock: Clock | None = None,
) -> "Savepoint":
    """Take a savepoint of the job whose checkpoint is ``checkpoint``.

    The cut is the newest committed micro-batch: source positions, every
    operator's state and the sinks' progress (batch id) agree there. With
    ``stop``, a running job is first asked to stop; it stops between batches,
    finishing any batch it had planned, so the cut is where it stopped. The
    savepoint goes to ``dest`` or ``<root>/<job>-b<batch>-<UTC time>``.
    """
    checkpoint = os.path.abspath(checkpoint)
    if not os.path.isdir(checkpoint):
        raise SavepointError(f"no checkpoint at {checkpoint}")
    stopped = _stop_job(checkpoint, timeout_s, progress, clock or SystemClock()) if stop else False
    running = os.path.exists(CheckpointLayout(checkpoint).running)
    meta = _describe_job(checkpoint, job)
    batch = last_batch(checkpoint, "commits")
    if batch < 0:
        raise SavepointError(f"the job at {checkpoint} has not committed a micro-batch yet: nothing to save")
    meta["stopped"] = stopped or not running
    meta["sources"] = offset_log_entry(checkpoint, batch)[1]
    if dest is None:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        dest = os.path.join(root, f"{meta['job']}-b{batch}-{stamp}")
    cut_checkpoint(checkpoint, dest, meta, batch)
    layout = CheckpointLayout(checkpoint)
    taken = read_json(layout.savepoints_taken) or []
    taken.append({"path": os.path.abspath(dest), "batch_id": batch, "at_ms": int(time.time() * 1000), "stopped": meta["stopped"]})
    write_json(layout.savepoints_taken, taken[-100:])  # the job's dashboard lists them
    progress(f"savepoint of '{meta['job']}' at batch {batch}: {os.path.abspath(dest)}")
    return Savepoint(dest)


def _clear_checkpoint(checkpoint: str) -> None:
    """Make way for a restore: the job's checkpoint must hold no progress."""
    if not os.path.exists(checkpoint):
        return
    if CheckpointLayout(checkpoint).has_progress():
        raise SavepointError(
            f"the job's checkpoint {checkpoint} already has progress: a savepoint starts a job from a new "
            "checkpoint (give the job another name, or delete that checkpoint; to continue a job restored "
            "earlier, run it without --from-savepoint)"
        )
    unknown = set(os.listdir(checkpoint)) - _CHECKPOINT_ENTRIES
    if unknown:
        raise SavepointError(f"{checkpoint} holds files that are not a checkpoint's ({', '.join(sorted(unknown))}); not replacing it")
    shutil.rmtree(checkpoint)


def restore_savepoint(
    spark: Any, path: str, checkpoint: str, graph: Graph, parallelism: int | None = None, keyed_operator: str = "auto",
    state_layout: str = "blob", state_backend: str = "rocksdb", max_parallelism: int | None = None,
) -> dict[str, Any]:
    """Make ``checkpoint`` (new) continue from the savepoint at ``path`` with the
    pipeline ``graph``: the savepoint is verified and the pipeline compared with
    the one that wrote it before anything is copied; with ``parallelism`` other
    than the savepoint's, its state is repartitioned (Spark's offline state
    repartitioning). The restored job gets a new identity, so its exactly-once
    sinks fence their writes apart from the original's (a what-if run and the
    original can write side by side). ``max_parallelism`` None: the savepoint's. With a
    ``state_layout`` other than the one the savepoint's keyed steps hold, their state is
    converted into it (convert.py)."""
    manifest = verify(path)
    held = stored_max_parallelism(manifest["pipeline"])  # None: no keyed steps' state to spread
    if max_parallelism is None:
        max_parallelism = held or default_max_parallelism(parallelism or 1)
    rescale = parallelism is not None and bool(manifest.get("partitions")) and parallelism != manifest["partitions"]
    if rescale:
        provider = batch_conf(path, int(manifest["batch_id"])).get("spark.sql.streaming.stateStore.providerClass")
        if provider is not None and not provider.endswith("RocksDBStateStoreProvider"):
            raise SavepointError(
                f"the savepoint's state is in {provider.rsplit('.', 1)[-1]}: rescaling (parallelism "
                f"{manifest['partitions']} -> {parallelism}) needs the RocksDB state backend (Ember's default); "
                "restore it without changing parallelism"
            )
    current = pipeline_manifest(graph, keyed_operator, state_layout, manifest["pipeline"], state_backend, max_parallelism)
    converting = layout_changes(manifest["pipeline"], current)  # restored into another state layout: convert.py
    problems = compare(as_converted(manifest["pipeline"], current) if converting else manifest["pipeline"], current)
    if problems:
        listed = "\n  - ".join(problems)
        raise RestartError(
            f"this pipeline cannot start from the savepoint {path}:\n  - {listed}\n"
            "Changes to stateless steps, sinks and added state are fine."
        )
    if rescale and held is not None and parallelism is not None and parallelism > held:  # (max_parallelism compared above)
        raise SavepointError(
            f"rescaling to parallelism {parallelism}: the job's keys are spread over {held} state buckets "
            f"(its max_parallelism), so at most {held} state partitions can hold state"
        )
    if converting:
        check_convertible(path, manifest, graph, parallelism, state_backend)
        rescale = False
    _clear_checkpoint(checkpoint)
    copy_into_checkpoint(path, checkpoint)
    layout = CheckpointLayout(checkpoint)
    for inherited in (layout.savepoints_taken, layout.run_history):  # the original job's history, not this one's
        if os.path.exists(inherited):
            os.remove(inherited)
    if os.path.exists(layout.job_id):
        os.remove(layout.job_id)  # a new identity: its sinks fence apart from the original job's
    write_json(layout.restored_from, {"savepoint": os.path.abspath(path), "batch_id": manifest["batch_id"]})
    try:
        if rescale and parallelism is not None:
            rescale_checkpoint(spark, checkpoint, parallelism)
        if converting:
            ops = manifest["pipeline"]["operators"]
            steps = [(i, op, new["name"]) for i, op, new in zip(spark_operator_ids(ops), ops, current["operators"])]
            write_converted_checkpoint(spark, checkpoint, int(manifest["batch_id"]), steps)
            write_json(layout.pipeline, converted_manifest(current), indent=1)
            print(f"[ember] the state of {', '.join(repr(n) for n in converting)} converted to state_layout="
                  f"'{state_layout}' from the savepoint {path}", file=sys.stderr, flush=True)
    except BaseException:
        shutil.rmtree(checkpoint, ignore_errors=True)  # no half-restored job is left behind
        raise
    return manifest


class Savepoint:
    """A savepoint on disk (verified when opened)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.manifest = verify(self.path)

    @property
    def job(self) -> str:
        return self.manifest["job"]

    @property
    def batch_id(self) -> int:
        return int(self.manifest["batch_id"])

    @property
    def partitions(self) -> int | None:
        return self.manifest.get("partitions")

    @property
    def operators(self) -> list[dict[str, Any]]:
        """The stateful operators, in Spark's order: name, kind, keys, state."""
        return list(self.manifest["pipeline"]["operators"])

    def state_bytes(self, index: int) -> int:
        """Bytes of operator ``index``'s state files in the savepoint."""
        prefix = os.path.join("state", str(index)) + os.sep
        return sum(int(size) for rel, (size, _) in self.manifest["files"].items() if rel.startswith(prefix))

    def read_state(self, operator: str, spark: Any = None) -> pd.DataFrame:
        """Operator ``operator``'s state as a pandas DataFrame (see state.read_state)."""
        return read_state(spark or _session(), self.path, operator)

    def read_broadcast_state(self, operator: str, spark: Any = None) -> dict[str, dict]:
        """The broadcast step ``operator``'s broadcast state: ``{state name: {key: value}}``."""
        return read_broadcast_state(spark or _session(), self.path, operator)

    def write_state(
        self, operator: str, state: pd.DataFrame | Callable[[pd.DataFrame], pd.DataFrame], dest: str, spark: Any = None
    ) -> "Savepoint":
        """A new savepoint at ``dest`` with ``operator``'s state replaced (see state.write_state)."""
        write_state(spark or _session(), self.path, operator, state, dest)
        return Savepoint(dest)

    def describe(self, spark: Any = None) -> str:
        """What ``ember savepoint inspect`` prints: the job, the cut, and per operator its keys and state size."""
        m = self.manifest
        lines = [
            f"savepoint {self.path}",
            f"  job {m['job']} (checkpoint {m.get('checkpoint', '?')}), batch {m['batch_id']}, "
            f"{m.get('partitions')} state partition(s), taken {m['created']}"
            + (" after the job stopped" if m.get("stopped") else " while the job ran"),
            f"  Spark {m.get('spark_version')}, Ember {m.get('ember_version')}; "
            f"{len(m['files'])} files, {sum(int(s) for s, _ in m['files'].values()):,} bytes",
        ]
        if m.get("derived_from"):
            d = m["derived_from"]
            lines.append(f"  written from {d['savepoint']} (batch {d['batch_id']}, operator '{d['operator']}' changed)")
        for i, source in enumerate(m.get("sources", [])):
            lines.append(f"  source {i}: offset {json.dumps(source, sort_keys=True)}")
        for i, op in zip(spark_operator_ids(self.operators), self.operators):
            if op.get("spark operators") == 0:
                lines.append(f"  '{op['name']}': {op['kind']}, no state (Spark plans no stateful operator for its query)")
                continue
            keys = ", ".join(op.get("keys", [])) or "-"
            line = f"  operator {i} '{op['name']}': {op['kind']}, key ({keys}), "
            if "spark operator" in op:  # on Ember's keyed runtime: its layout (convert.py changes it on restore)
                line += f"state layout '{op.get('state layout', 'blob')}' on {op['spark operator']}, "
            line += f"{self.state_bytes(i):,} bytes of state files"
            if "lane" in op:
                line += f" (lane {op['lane']}: the files of all its lanes)"
            if spark is not None:
                frame = self.read_state(op["name"], spark)
                key_cols = [k for k in op.get("keys", []) if k in frame.columns]
                n_keys = len(frame.drop_duplicates(key_cols)) if key_cols else len(frame)
                line += f", {n_keys:,} key(s), {len(frame):,} state row(s)"
            lines.append(line)
            for what, value in op.get("state", {}).items():
                lines.append(f"      {what}: {json.dumps(value) if not isinstance(value, str) else value}")
        return "\n".join(lines)


def _session() -> Any:
    """The active SparkSession, or a local one with Ember's defaults."""
    from ember.runner.spark.session import get_or_create_session

    return get_or_create_session(EnvironmentConfig())
