"""The one layout of a job's checkpoint directory: Spark's logs and Ember's files.

A checkpoint is Spark's (``offsets/``, ``commits/``, ``state/``, ``sources/``,
``metadata``) plus Ember's own folder ``ember/``::

    ember/pipeline.json       the pipeline manifest a restart is checked against
    ember/operators.json      each keyed operator's key types (savepoints place new keys with them)
    ember/origin-<step>       a generator's event-time origin (epoch ms), fixed by the first run
    ember/job-id              the job's identity, with which exactly-once sinks fence their writes
    ember/restored-from.json  the savepoint a restored job started from
    ember/spool/<step>/<batch>/  detoured side outputs of a micro-batch (spool.py)
    ember/quiet/<step>/       a keyed step's buckets without timers, marked (keyed/reach.py)
    ember/running             while a job runs: its pid, host and name
    ember/stop                the runner asks Ember's sources to admit no more input
    ember/stop-request        `ember savepoint create --stop` asks the running job to stop
    ember/end-of-input        every bounded source ended: the final watermark may pass

The last four are run-time markers, never part of a savepoint. Every other
module reaches these paths through :class:`CheckpointLayout`; Spark's logs are
read with the functions below.
"""

from __future__ import annotations

import glob
import json
import os
import re
import tempfile
import time
import uuid
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable

from ember.errors import EmberError

__all__ = [
    "CheckpointLayout",
    "RUNTIME_MARKERS",
    "EMBER_DIR",
    "QUIET",
    "last_batch",
    "last_committed_batch",
    "planned_batch",
    "offset_log_entry",
    "batch_conf",
    "checkpoint_partitions",
    "write_json",
    "read_json",
    "fixed_origin",
    "fixed_token",
    "admission_stopped",
    "admission_bound",
    "mark_source_done",
    "sources_done",
    "clear_done_marks",
    "is_runtime_marker",
    "DONE_SUFFIX",
    "disk_bytes",
    "state_writes",
]

EMBER_DIR = "ember"
QUIET = "quiet"  # ember/quiet/<step>/: a keyed step's quiet-bucket marks, believed only by the run that wrote them
INITIAL_STATE = "initial-state"  # ember/initial-state/<step>.parquet: a converted checkpoint's keyed state (savepoints/convert.py)
START_OFFSETS = "start-offsets.json"  # ember/start-offsets.json: its sources' start positions
RUNNING, STOP, STOP_REQUEST, END_OF_INPUT = "running", "stop", "stop-request", "end-of-input"
RUNTIME_MARKERS = frozenset({RUNNING, STOP, STOP_REQUEST, END_OF_INPUT})


@dataclass(frozen=True)
class CheckpointLayout:
    """The paths of one checkpoint (``path`` is its root directory)."""

    path: str

    @staticmethod
    def for_explain(checkpoint: str | None) -> "CheckpointLayout":
        """The job's layout, or one in a fresh temporary directory for a pipeline
        compiled without a checkpoint (to be explained, never run)."""
        return CheckpointLayout(checkpoint or tempfile.mkdtemp(prefix="ember-explain-"))

    @property
    def ember_dir(self) -> str:
        return os.path.join(self.path, EMBER_DIR)

    def _file(self, name: str) -> str:
        return os.path.join(self.ember_dir, name)

    @property
    def pipeline(self) -> str:
        return self._file("pipeline.json")

    @property
    def operators(self) -> str:
        return self._file("operators.json")

    @property
    def job_id(self) -> str:
        return self._file("job-id")

    @property
    def restored_from(self) -> str:
        return self._file("restored-from.json")

    @property
    def running(self) -> str:
        return self._file(RUNNING)

    @property
    def batch_bound(self) -> str:
        """The per-batch bound the latency-target controller sets (latency.py); sources read it."""
        return self._file("batch-bound")

    @property
    def leader_lock(self) -> str:
        """Held (``flock``) by the process running the job: one driver per checkpoint (leader.py).
        Beside the checkpoint directory, not in it: a restore from a savepoint replaces the
        directory while the lock is held."""
        return os.path.normpath(self.path) + ".leader.lock"

    @property
    def savepoints_taken(self) -> str:
        """The savepoints taken of this job (savepoints/: path, batch, time), for the dashboard."""
        return self._file("savepoints-taken.json")

    @property
    def run_history(self) -> str:
        """Every start of the job while watched (ember.ui: attempt, start, end)."""
        return self._file("dashboard-runs.json")

    @property
    def stop_marker(self) -> str:
        return self._file(STOP)

    @property
    def stop_request(self) -> str:
        return self._file(STOP_REQUEST)

    @property
    def end_of_input(self) -> str:
        return self._file(END_OF_INPUT)

    def origin(self, step: str) -> str:
        return self._file(f"origin-{step}")

    def spool(self, step: str) -> str:
        return os.path.join(self.ember_dir, "spool", _safe(step))

    def quiet(self, step: str) -> str:
        """A keyed step's marks of its buckets without timers (keyed/reach.py); never part of a savepoint."""
        return os.path.join(self.ember_dir, QUIET, _safe(step))

    @property
    def initial_states(self) -> str:
        """The folder of a converted checkpoint's keyed state files (:meth:`initial_state`)."""
        return os.path.join(self.ember_dir, INITIAL_STATE)

    def initial_state(self, step: str) -> str:
        """A keyed step's state handed to its Spark operator in the first micro-batch of a
        checkpoint converted from a savepoint of another state layout (savepoints/convert.py):
        Parquet, one row per state bucket (the bucket, its state pickled as the blob layout's)."""
        return os.path.join(self.initial_states, _safe(step) + ".parquet")

    @property
    def start_offsets(self) -> str:
        """A converted checkpoint's source positions (savepoints/convert.py): the savepoint's
        offsets, which its sources start from; by source once the job maps them (execution.py)."""
        return self._file(START_OFFSETS)

    def converting(self) -> bool:
        """Whether this checkpoint is a converted one whose first micro-batch (which hands
        the keyed steps their state) has not committed yet."""
        return os.path.exists(self.start_offsets) and last_batch(self.path, "commits") < 0

    def has_progress(self) -> bool:
        """Spark planned at least one batch from this checkpoint (its offset log is not empty)."""
        return last_batch(self.path, "offsets") >= 0


def _safe(step: str) -> str:
    """A step's name as a folder name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in step)


# The pipeline manifest's mark of a checkpoint whose in-batch keyed step runs without Spark's
# group timeout (translators/keyed.py: without_group_timeout). A checkpoint with progress and
# no mark predates that rule: its step's state rows carry the timeout column, so it keeps one.
GROUP_TIMEOUTS = "group timeouts"
GROUP_TIMEOUTS_WHERE_NEEDED = "where needed"


def group_timeouts_everywhere(checkpoint: str | None) -> bool:
    """Whether ``checkpoint``'s event-time keyed step keeps Spark's group timeout even where it
    fires in the batch: the checkpoint has progress and its manifest does not say otherwise."""
    if not checkpoint:
        return False
    layout = CheckpointLayout(checkpoint)
    if not layout.has_progress():
        return False
    manifest = read_json(layout.pipeline)
    return not isinstance(manifest, dict) or manifest.get(GROUP_TIMEOUTS) != GROUP_TIMEOUTS_WHERE_NEEDED


def stored_keyed_operator(manifest: Any) -> str | None:
    """The Spark operator a stored manifest holds its keyed-runtime steps on, when it names one
    (the delta layout's steps, always on TWS, aside); None for none or several."""
    if not isinstance(manifest, dict):
        return None
    held = {op["spark operator"] for op in manifest.get("operators", [])
            if isinstance(op, dict) and "spark operator" in op and op.get("state layout") != "delta"}
    return held.pop() if len(held) == 1 else None


def checkpoint_keyed_operator(checkpoint: str | None) -> str | None:
    """``stored_keyed_operator`` of ``checkpoint``'s manifest, if it has progress."""
    if not checkpoint:
        return None
    layout = CheckpointLayout(checkpoint)
    if not layout.has_progress() or not os.path.exists(layout.pipeline):
        return None
    return stored_keyed_operator(read_json(layout.pipeline))  # (a corrupt one: check_restart says so)


def last_batch(checkpoint: str, log: str) -> int:
    """The newest batch id in a checkpoint's ``offsets`` or ``commits`` log (-1 when none)."""
    folder = os.path.join(checkpoint, log)
    ids = [int(f) for f in os.listdir(folder) if f.isdigit()] if os.path.isdir(folder) else []
    return max(ids, default=-1)


def last_committed_batch(checkpoint: str) -> int:
    """The newest batch id in Spark's commit log (-1 when none)."""
    return last_batch(checkpoint, "commits")


def planned_batch(checkpoint: str) -> int | None:
    """The batch Spark planned (offset log) but has not committed, if any."""
    planned, committed = last_batch(checkpoint, "offsets"), last_committed_batch(checkpoint)
    return planned if planned > committed else None


def offset_log_entry(checkpoint: str, batch_id: int) -> tuple[dict[str, Any], list[Any]]:
    """Spark's offset log entry of batch ``batch_id``: its metadata (watermark, batch
    time, the session settings it ran with) and each source's offset (parsed JSON,
    or the text when it is not JSON). Raises OSError when there is none."""
    with open(os.path.join(checkpoint, "offsets", str(batch_id))) as f:
        lines = f.read().splitlines()  # "v1", the metadata, then one line per source
    try:
        meta = json.loads(lines[1]) if len(lines) > 1 else {}
    except ValueError:
        meta = {}
    sources = []
    for line in lines[2:]:
        try:
            sources.append(json.loads(line))
        except ValueError:
            sources.append(line)
    return meta if isinstance(meta, dict) else {}, sources


def batch_conf(checkpoint: str, batch_id: int) -> dict[str, str]:
    """The Spark settings batch ``batch_id`` ran with ({} when unknown)."""
    try:
        return offset_log_entry(checkpoint, batch_id)[0].get("conf", {})
    except OSError:
        return {}


def checkpoint_partitions(checkpoint: str, batch_id: int) -> int | None:
    """The state partition count (Spark shuffle partitions) batch ``batch_id`` ran with."""
    try:
        return int(batch_conf(checkpoint, batch_id)["spark.sql.shuffle.partitions"])
    except (KeyError, ValueError):
        return None


# -- Ember's files -----------------------------------------------------------------------
def write_json(path: str, value: Any, *, indent: int | None = None) -> None:
    """Write ``value`` to ``path`` atomically (a temporary file, then a rename)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, sort_keys=True, indent=indent)
    os.replace(tmp, path)


def disk_bytes(path: str) -> int:
    """The bytes of every file under ``path`` (files removed while walking, e.g. by Spark's
    state maintenance, are skipped)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def read_json(path: str) -> Any:
    """The JSON value at ``path`` (None when there is no such file)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def fixed_origin(path: str) -> int:
    """The epoch ms stored at ``path``; the first caller (the runner for Spark's
    native source, the Python reader otherwise) stores 'now', atomically."""
    return int(_fixed(path, lambda: str(time.time_ns() // 1_000_000)))


def fixed_token(path: str) -> str:
    """A random id stored at ``path`` by its first caller (a job's identity)."""
    return _fixed(path, lambda: uuid.uuid4().hex[:16])


def _fixed(path: str, make: Callable[[], str]) -> str:
    """The value stored at ``path``, storing ``make()`` first if there is none
    (atomically: a temporary file hard-linked into place, so the first caller wins)."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(make())
    try:
        os.link(tmp, path)  # fails if another caller stored it first
    except FileExistsError:
        pass
    finally:
        os.remove(tmp)
    with open(path) as f:
        return f.read()


def admission_stopped(options: dict[str, str]) -> bool:
    """In a source reader: the driver asked for a graceful stop (the ``stop_marker``
    option names the job's stop marker): admit nothing new."""
    marker = options.get("stop_marker")
    return marker is not None and marker != "" and os.path.exists(marker)


def mark_source_done(options: dict[str, str]) -> None:
    """In a bounded source's reader, once its offsets read it to its end: say so beside the
    end-of-input marker (the ``done_file`` option), so the end-of-input reader can send its
    row in the same micro-batch as the last input (datasources.EndOfInputReader)."""
    path = options.get("done_file")
    if path and not os.path.exists(path):
        open(path, "a").close()


DONE_SUFFIX = ".done."  # <end-of-input marker>.done.<source step>: that source has read its last input


def _done_marks(marker: str) -> list[str]:
    return glob.glob(glob.escape(marker) + DONE_SUFFIX + "*")


def sources_done(marker: str, expected: int) -> bool:
    """Whether ``expected`` bounded sources marked themselves done beside ``marker``."""
    return expected > 0 and len(_done_marks(marker)) >= expected


def is_runtime_marker(name: str) -> bool:
    """Whether ``name`` (a file of Ember's checkpoint directory) only matters to a running job:
    savepoints leave it out, and a sources' done mark is cleared when a job starts (its
    sources mark themselves again when they reach their end in that run)."""
    return name in RUNTIME_MARKERS or name.startswith(END_OF_INPUT + DONE_SUFFIX)


def clear_done_marks(marker: str) -> None:
    """Remove the bounded sources' done marks beside ``marker`` (left by an earlier run)."""
    for path in _done_marks(marker):
        os.remove(path)


def admission_bound(options: dict[str, str], limit: int) -> int:
    """In a source reader: the per-batch bound to admit — ``limit``, or less when the driver
    adapts it to a latency target (the ``bound_file`` option names the file it writes)."""
    path = options.get("bound_file")
    if not path:
        return limit
    try:
        with open(path) as f:
            return max(1, min(limit, int(f.read().strip() or limit)))
    except (OSError, ValueError):
        return limit


def state_writes(checkpoint: str, last: int) -> dict[str, Any]:
    """What the state store wrote to ``checkpoint`` per batch in the last ``last``
    versions (a run's batches): each version's RocksDB changelog (all operators and
    partitions; the median, past the checkpoint's first version, which holds the first
    keys), plus the snapshots (zip files and the SST files they upload) spread over all
    versions."""
    changelog: dict[int, int] = {}
    snapshots = 0
    for root, _dirs, files in os.walk(os.path.join(checkpoint, "state")):
        for name in files:
            if name.startswith("."):
                continue  # Hadoop's checksum files
            size = os.path.getsize(os.path.join(root, name))
            found = re.fullmatch(r"(\d+)\.changelog", name)
            if found:
                changelog[int(found.group(1))] = changelog.get(int(found.group(1)), 0) + size
            elif name.endswith((".zip", ".sst")):
                snapshots += size
    versions = sorted(changelog)
    steady = [changelog[v] for v in versions[1:][-last:]] or [changelog[v] for v in versions]
    per_batch = median(steady) if steady else 0
    return {
        "checkpoint_bytes_per_batch": round(per_batch + (snapshots / len(versions) if versions else 0)),
        "checkpoint_changelog_bytes_per_batch": round(per_batch),
        "checkpoint_snapshot_bytes": snapshots,
        "checkpoint_versions": len(versions),
    }


# -- a converted checkpoint's sources (savepoints/convert.py) -------------------------------

START_OFFSETS_OPTION, SOURCE_ID_OPTION = "start_offsets", "ember_source"  # options of Ember's Python sources
BY_SOURCE = "by_source"
END_OF_INPUT_SOURCE = "__end_of_input"  # the end-of-input readers' source ids, numbered (step names are the others')


def start_offset(options: dict[str, str], default: dict[str, Any]) -> dict[str, Any]:
    """An Ember source's first offset: ``default`` — or, in a checkpoint converted from a
    savepoint (its first micro-batch, whose end offsets are the savepoint's), the savepoint's
    position of this source, so that batch reads nothing and the next goes on from there.
    Spark asks a source for its initial offset only for micro-batch 0."""
    path, me = options.get(START_OFFSETS_OPTION), options.get(SOURCE_ID_OPTION)
    if not path or not os.path.exists(path):
        return default
    by_source = (read_json(path) or {}).get(BY_SOURCE) or {}
    if me not in by_source:
        raise EmberError(f"the converted checkpoint's start positions ({path}) name no position for source '{me}': "
                         "it would read its input again from the start")
    start = json.loads(by_source[me])
    return start if isinstance(start, dict) else default
