"""Design B of keyed state (issue 18, docs/design/keyed-state-at-scale.md): per state bucket,
a *delta log* in Spark's state store and a columnar working copy on the executor's disk.

Design A (bucket.py, vectorized.py) stores each bucket's whole table as one value, so a
batch rewrites — and checkpoints — every touched bucket in full. Here:

- **Durable part (Spark's state store, exactly once):** a ``ListState`` of *parts*, one
  appended per batch that changed the bucket, each an Arrow IPC stream of the rows that
  changed (key, state fields, a deletion flag); and a *version* naming the last write (a
  ``ValueState``, or for a process function a field of its bucket blob: keyed/tws.py). On
  RocksDB with changelog checkpointing an append writes only the appended bytes (measured:
  12,826,130 changelog bytes for 12,800,000 appended), so checkpoint bytes per batch follow
  the keys a batch changed, not the state's size.
- **Working copy (executor-local disk):** the bucket's table as sorted, memory-mapped numpy
  columns (:class:`LocalTable`), tagged with the version it reflects and the machine's boot.
  Every Python worker of the executor can open it; lookups and updates are vectorised
  (``searchsorted`` and fancy indexing), in place for keys that exist, a merge for new ones.
- **Per call:** if the copy's tag is not the stored version (first use on this machine, a
  replayed batch, a batch that failed after writing the copy, the partition moved, the
  machine rebooted), the copy is rebuilt by folding the log. The copy is a cache: losing it
  costs a rebuild, never a result.
- **Compaction:** when the log holds more than ~3x the live rows, it is replaced by the live
  table (amortised: ~1.33x the changed rows' bytes per batch; staggered across buckets).

A vectorised step's copy is indexed by its one integer key and holds numeric columns
(:func:`delta_layout_problem` says why another cannot); the per-record runtime's copy is
indexed by :func:`key_hashes`, so its keys may be of any type. Which steps run on it under
``StreamEnvironment(state_layout="delta")``: :func:`uses_delta`.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import mmap
import os
import pickle
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

__all__ = [
    "LocalTable", "SlotTable", "DeltaKeys", "DeltaLog", "Version", "fold_parts", "encode_part", "decode_part",
    "DELETED", "KEY", "BINARY", "COMPACT_FACTOR", "DELTA_COUNTERS", "local_state_root", "step_directory", "drop_local_state",
    "uses_delta", "delta_layout_problem", "numpy_types", "key_hashes", "OVERFLOW", "StoredQueue",
]

DELETED = "__ember_deleted"
KEY = "__ember_key"
COMPACT_FACTOR = 3.0  # compact a bucket's log once it holds this many times its live rows (+ the stagger)
COMPACT_MIN_ROWS = 4096  # never compact a log shorter than this: small buckets are cheap to fold
PART_ROWS = 1 << 20  # rows per part when a compaction writes the live table
# Job-wide counters of what delta steps did (JobResult.counters; ember bench grouping-keyed).
DELTA_COUNTERS = ("state_changed_keys", "state_appended_bytes", "state_compacted_bytes", "state_rebuilt_rows")
NUMERIC_KINDS = ("tinyint", "smallint", "int", "bigint", "float", "double", "boolean")
_NUMPY = {"tinyint": np.int8, "smallint": np.int16, "int": np.int32, "bigint": np.int64,
          "float": np.float32, "double": np.float64, "boolean": np.bool_}


def uses_delta(node: Any, state_layout: str, graph: Any = None) -> bool:
    """Whether keyed step ``node`` keeps its state on design B under ``state_layout``: a
    vectorised step, a process function (also rolling aggregations and CEP, which run as
    one), a two-input step (co-process, broadcast state, window joins, interval joins beside
    other stateful steps: process functions on the union of their inputs) or a window on
    Ember's operator. Spark's native windows
    keep their layout."""
    from ember.graph import nodes as n
    from ember.runner.spark.placement import native_join, native_window

    if state_layout != "delta":
        return False
    if isinstance(node, n.VectorizedProcessNode | n.KeyedProcessNode):
        return True
    if isinstance(node, n.WindowNode):
        return graph is not None and not native_window(node, graph)
    if isinstance(node, n.IntervalJoinNode):  # beside other stateful steps: a co-process step
        return graph is not None and not native_join(node, graph)
    return False


def delta_layout_problem(key_kinds: list[str], state_kinds: list[str]) -> str | None:
    """Why a step's keys or state cannot use the delta layout (None: they can)."""
    if len(key_kinds) != 1 or key_kinds[0] not in ("tinyint", "smallint", "int", "bigint"):
        return f"its key must be one integer field (got {', '.join(key_kinds)})"
    bad = [k for k in state_kinds if k not in NUMERIC_KINDS]
    if bad:
        return f"its state fields must be numbers or booleans (got {', '.join(bad)})"
    return None


def numpy_types(state_kinds: list[str]) -> list[Any]:
    return [_NUMPY[k] for k in state_kinds]


def _boot_id() -> str:
    """Changes when the machine restarts: a copy written before a crash of the host (whose
    page cache may not have reached the disk) is then never trusted."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


BOOT_ID = _boot_id()


def local_state_root() -> str:
    """Where executors keep working copies: ``$EMBER_LOCAL_STATE_DIR``, else the temp dir."""
    return os.environ.get("EMBER_LOCAL_STATE_DIR") or os.path.join(tempfile.gettempdir(), "ember-local-state")


def drop_local_state(checkpoint: str) -> None:
    """Remove this machine's working copies of the job checkpointed at ``checkpoint`` (always
    safe: a missing copy is rebuilt from the log; for a job whose checkpoint is deleted)."""
    import shutil

    shutil.rmtree(os.path.join(local_state_root(), os.path.dirname(step_directory(checkpoint, "-"))), ignore_errors=True)


def step_directory(checkpoint: str | None, step: str) -> str:
    """A step's working copies, relative to :func:`local_state_root` on each executor:
    ``<the job's checkpoint path, hashed>/<step>`` (one subdirectory per bucket)."""
    job = hashlib.sha1((checkpoint or "no-checkpoint").encode()).hexdigest()[:16]
    return os.path.join(job, re.sub(r"[^A-Za-z0-9_.-]", "_", step))


# -- the log's parts ----------------------------------------------------------------------

def encode_part(keys: np.ndarray, columns: list[np.ndarray], deleted: np.ndarray, fields: list[str]) -> bytes:
    """Changed rows as one Arrow IPC stream (key, the state fields, the deletion flag)."""
    arrays = [pa.array(keys)] + [c if isinstance(c, pa.Array) else pa.array(c) for c in columns] + [pa.array(deleted, pa.bool_())]
    batch = pa.RecordBatch.from_arrays(arrays, names=[KEY, *fields, DELETED])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_part(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(blob).read_all()


OVERFLOW = "overflow"  # in a process function's bucket blob: slots of keys whose hash another key's entry holds
BINARY = "binary"  # the type of a column of bytes (a process function's pickled slots): an Arrow array


def _empty(kind: Any) -> Any:
    return pa.array([], pa.binary()) if kind == BINARY else np.empty(0, kind)


def fold_parts(parts: Iterable[bytes], fields: list[str], types: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """The live table the log's parts describe, applied in order: each key's last row
    wins, a deletion removes it. Returns the keys sorted and the state columns (numpy,
    or an Arrow binary array for a BINARY column)."""
    tables = [decode_part(p) for p in parts]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return np.empty(0, np.int64), [_empty(t) for t in types]
    table = pa.concat_tables(tables)
    keys = table.column(KEY).to_numpy().astype(np.int64, copy=False)
    # The last occurrence of each key: np.unique's first index in the reversed keys.
    unique, first_reversed = np.unique(keys[::-1], return_index=True)
    last = len(keys) - 1 - first_reversed
    alive = ~table.column(DELETED).to_numpy(zero_copy_only=False)[last]
    rows = last[alive]
    columns = [table.column(f).take(pa.array(rows)).combine_chunks() if t == BINARY
               else table.column(f).to_numpy(zero_copy_only=False)[rows].astype(t, copy=False) for f, t in zip(fields, types)]
    return unique[alive], columns


@dataclass(frozen=True)
class Version:
    """What a bucket's log holds: the tag of its last write, its parts and rows, the live rows."""

    tag: str = ""
    parts: int = 0
    logged: int = 0
    live: int = 0

    SCHEMA = "tag string, parts long, logged long, live long"

    @classmethod
    def of(cls, row: tuple[Any, ...] | None) -> "Version":
        return cls() if row is None else cls(str(row[0]), int(row[1]), int(row[2]), int(row[3]))

    def row(self) -> tuple[Any, ...]:
        return (self.tag, self.parts, self.logged, self.live)


def new_tag() -> str:
    return secrets.token_hex(12)


# -- the working copy -----------------------------------------------------------------------

class LocalTable:
    """One bucket's table on local disk: ``keys.npy`` (sorted int64), one ``f<i>.npy`` per
    state field, and ``tag`` (the version it reflects, with the boot id; removed while a
    write is under way). Columns are memory-mapped, so the table is on disk, not in the
    Python worker's memory."""

    def __init__(self, directory: str, types: list[Any]) -> None:
        self.dir, self.types = directory, types
        self.keys: np.ndarray = np.empty(0, np.int64)
        self.columns: list[np.ndarray] = [np.empty(0, t) for t in types]

    # tag ---------------------------------------------------------------------------------
    def _tag_path(self) -> str:
        return os.path.join(self.dir, "tag")

    def tag(self) -> str | None:
        """The version the copy holds, or None (no copy, a write cut short, another boot)."""
        try:
            text = Path(self._tag_path()).read_text()
        except OSError:
            return None
        tag, _, boot = text.partition(" ")
        return tag if boot == BOOT_ID and tag else None

    def _set_tag(self, tag: str) -> None:
        if tag == "dirty":  # a copy without a tag is never trusted: one unlink marks a write under way
            try:
                os.unlink(self._tag_path())
            except FileNotFoundError:
                pass
            return
        tmp = self._tag_path() + ".tmp"
        Path(tmp).write_text(f"{tag} {BOOT_ID}")
        os.replace(tmp, self._tag_path())

    # columns -------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.npy")

    def load(self) -> None:
        """Map the columns (after :meth:`tag` said the copy is current)."""
        keys = np.load(self._path("keys"), mmap_mode="r")
        if len(keys) == 0:  # nothing to map
            self.keys, self.columns = np.empty(0, np.int64), [np.empty(0, t) for t in self.types]
            return
        self.keys = keys
        self.columns = [np.load(self._path(f"f{i}"), mmap_mode="r+") for i in range(len(self.types))]

    def replace(self, keys: np.ndarray, columns: list[np.ndarray], tag: str) -> None:
        """Write a whole table (a rebuild, or a merge of new keys) and tag it."""
        os.makedirs(self.dir, exist_ok=True)
        self._set_tag("dirty")
        self.close()
        for name, data in [("keys", keys), *[(f"f{i}", c) for i, c in enumerate(columns)]]:
            tmp = self._path(name) + ".tmp.npy"
            np.save(tmp, np.ascontiguousarray(data))
            os.replace(tmp, self._path(name))
        self.load()
        self._set_tag(tag)

    def close(self) -> None:
        for a in [self.keys, *self.columns]:
            mm = getattr(a, "_mmap", None)
            if mm is not None:
                mm.close()
        self.keys, self.columns = np.empty(0, np.int64), [np.empty(0, t) for t in self.types]

    # reads and writes ------------------------------------------------------------------------
    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``keys`` in the table and whether each is there."""
        n = len(self.keys)
        pos = np.searchsorted(self.keys, keys)
        found = pos < n
        found[found] = self.keys[pos[found]] == keys[found]
        return pos, found

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """The keys among ``keys`` (sorted, unique) that have state, and their state."""
        pos, found = self.find(keys)
        at = pos[found]
        return keys[found], [np.asarray(c[at]) for c in self.columns]

    def apply(self, keys: np.ndarray, columns: list[np.ndarray], deleted: np.ndarray, tag: str) -> None:
        """Change rows in place (keys that exist), merge new keys and drop deleted ones (a
        rewrite of the bucket's table, only when there are such), then tag the copy."""
        pos, found = self.find(keys)
        self._set_tag("dirty")
        update = found & ~deleted
        at = pos[update]
        for column, values in zip(self.columns, columns):
            column[at] = values[update]
        drop = found & deleted
        add = ~found & ~deleted
        if drop.any() or add.any():
            keep = np.ones(len(self.keys), bool)
            keep[pos[drop]] = False
            merged_keys = np.concatenate([np.asarray(self.keys)[keep], keys[add]])
            order = np.argsort(merged_keys, kind="stable")
            merged = [np.concatenate([np.asarray(c)[keep], v[add]])[order] for c, v in zip(self.columns, columns)]
            self.replace(merged_keys[order], merged, tag)
            return
        # No msync: the mapping is shared, so another process of this machine reads the
        # change from the page cache; a crash of the machine is caught by the boot id.
        self._set_tag(tag)

    def column_slices(self, start: int, stop: int) -> list[Any]:
        return [np.asarray(c[start:stop]) for c in self.columns]

    def __len__(self) -> int:
        return len(self.keys)


class SlotTable(LocalTable):
    """One bucket's table of a process function on local disk: ``keys.npy`` (sorted int64),
    ``offsets.npy`` and ``lengths.npy`` (int64) into ``heap.bin``, where each key's slot (its
    pickled state values and timers) is appended when it changes; the same ``tag`` protocol
    as :class:`LocalTable`. Changing a key that exists appends its bytes and rewrites its
    offset in place; new or deleted keys rewrite the index (not the heap); the heap is
    rewritten once it holds more than twice its live bytes. Beside it, ``timers.pkl``,
    ``timers.log`` and ``timers.tag``: the bucket's timer queues, a cache like the rest (tagged; rebuilt from
    the slots, which hold each key's timers): the checkpointed log never holds them, so a batch writes to the checkpoint only
    the slots it changed, however many timers wait."""

    GARBAGE_FACTOR, GARBAGE_MIN = 2, 1 << 20
    TIMER_LOG_MIN = 1 << 16  # the timer log is folded into timers.pkl once past this or that file's size

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.types = [BINARY]
        self._empty()

    def _empty(self) -> None:
        self.keys = np.empty(0, np.int64)
        self.offsets, self.lengths = np.empty(0, np.int64), np.empty(0, np.int64)
        self.heap: Any = b""  # the heap file mapped (mmap: a slice is its bytes), or b"" when empty

    def _heap_path(self) -> str:
        return os.path.join(self.dir, "heap.bin")

    def load(self) -> None:
        keys = np.load(self._path("keys"), mmap_mode="r")
        if len(keys) == 0:
            self._empty()
            return
        self.keys = keys
        self.offsets = np.load(self._path("offsets"), mmap_mode="r+")
        self.lengths = np.load(self._path("lengths"), mmap_mode="r+")
        self.heap = b""
        if os.path.getsize(self._heap_path()):
            with open(self._heap_path(), "rb") as f:
                self.heap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def close(self) -> None:
        for a in (self.keys, self.offsets, self.lengths):
            mm = getattr(a, "_mmap", None)
            if mm is not None:
                mm.close()
        if isinstance(self.heap, mmap.mmap):
            self.heap.close()
        self._empty()

    def _write_index(self, keys: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
        for name, data in (("keys", keys), ("offsets", offsets), ("lengths", lengths)):
            tmp = self._path(name) + ".tmp.npy"
            np.save(tmp, np.ascontiguousarray(data, dtype=np.int64))
            os.replace(tmp, self._path(name))

    def replace(self, keys: np.ndarray, columns: list[Any], tag: str) -> None:
        """Write a whole table (a rebuild from the log) and tag it."""
        values = columns[0] if isinstance(columns[0], pa.Array) else pa.array(columns[0], pa.binary())
        os.makedirs(self.dir, exist_ok=True)
        self._set_tag("dirty")
        self.close()
        offsets, data = _binary_buffers(values)
        tmp = self._heap_path() + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self._heap_path())
        self._write_index(keys, offsets[:-1], np.diff(offsets))
        self.load()
        self._set_tag(tag)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        """The keys among ``keys`` (sorted, unique) that have state, and their slots' bytes."""
        pos, found = self.find(keys)
        at = pos[found]
        heap = self.heap
        blobs = [heap[o:o + n] for o, n in zip(self.offsets[at].tolist(), self.lengths[at].tolist())]
        return keys[found], [blobs]

    def apply(self, keys: np.ndarray, columns: list[Any], deleted: np.ndarray, tag: str) -> None:
        """Store changed slots (``columns[0]``: bytes per key, ignored where deleted)."""
        values = columns[0] if isinstance(columns[0], pa.Array) else pa.array(columns[0], pa.binary())
        pos, found = self.find(keys)
        self._set_tag("dirty")
        offsets, data = _binary_buffers(values)
        with open(self._heap_path(), "ab") as f:
            base = f.tell()  # the file's end (not the mapped heap's: an empty table maps none of it)
            f.write(data)
        starts, lengths = offsets[:-1] + base, np.diff(offsets)
        update = found & ~deleted
        drop, add = found & deleted, ~found & ~deleted
        if drop.any() or add.any():
            keep = np.ones(len(self.keys), bool)
            keep[pos[drop]] = False
            old_offsets, old_lengths = np.asarray(self.offsets).copy(), np.asarray(self.lengths).copy()
            old_offsets[pos[update]], old_lengths[pos[update]] = starts[update], lengths[update]
            merged_keys = np.concatenate([np.asarray(self.keys)[keep], keys[add]])
            order = np.argsort(merged_keys, kind="stable")
            merged_offsets = np.concatenate([old_offsets[keep], starts[add]])[order]
            merged_lengths = np.concatenate([old_lengths[keep], lengths[add]])[order]
            self.close()
            self._write_index(merged_keys[order], merged_offsets, merged_lengths)
        else:
            self.offsets[pos[update]] = starts[update]
            self.lengths[pos[update]] = lengths[update]
            self.close()  # (no msync: see LocalTable.apply)
        self.load()
        if len(self.heap) > self.GARBAGE_FACTOR * int(np.sum(self.lengths)) + self.GARBAGE_MIN:
            self._compact_heap(tag)
            return
        self._set_tag(tag)

    def _compact_heap(self, tag: str) -> None:
        blobs = pa.array([self.heap[o:o + n] for o, n in zip(self.offsets.tolist(), self.lengths.tolist())],
                         pa.binary())
        self.replace(np.asarray(self.keys).copy(), [blobs], tag)

    # timer queues ----------------------------------------------------------------------------
    def _timers_path(self, ext: str) -> str:
        return os.path.join(self.dir, f"timers.{ext}")

    def timers(self, tag: str, rebuild: Any) -> tuple[Any, Any] | None:
        """The bucket's timer queues (event time, processing time) as the copy at ``tag``
        holds them, or None: none vouched for at that tag on this boot (written before a
        crash, by another version, or never) — then :meth:`rebuild_timers`.

        ``timers.tag`` says which copy version (and boot) the queues of which stamp belong
        to, how many bytes of ``timers.log`` they include, and each queue's length and
        earliest time. ``timers.pkl`` holds the queues as last written whole, under that
        stamp; ``timers.log`` the changes since, one pickled frame per call that pushed or
        popped: (stamp, the entries pushed and the sequence numbers popped, per queue). The
        queues come back as :class:`StoredQueue`: read (the whole file, then the log's
        vouched frames) only when a call pushes or pops — a bucket whose timers neither fire
        nor change reads one line — as :class:`LoggedQueue`, which notes what the call
        changes; ``rebuild()`` gives both queues if a file then fails its stamp or length."""
        try:
            vouched, boot, stamp, logged, *sizes = Path(self._timers_path("tag")).read_text().split(" ")
            log_bytes = int(logged)
            lengths, heads = [int(sizes[0]), int(sizes[2])], [int(sizes[1]), int(sizes[3])]
        except Exception:  # noqa: BLE001 - missing, cut short or of an older format: rebuilt from the slots
            return None
        if not tag or (vouched, boot) != (tag, BOOT_ID):
            return None
        self._timers_stamp, self._timers_logged = stamp, log_bytes
        loaded: list[Any] = []

        def load(index: int) -> list:
            if not loaded:
                queues = self._read_timers(stamp, log_bytes)
                loaded.extend(queues if queues is not None else rebuild())
            return loaded[index]

        return StoredQueue(lengths[0], heads[0], lambda: load(0)), StoredQueue(lengths[1], heads[1], lambda: load(1))

    def _read_timers(self, stamp: str, log_bytes: int) -> list[LoggedQueue] | None:
        """The queues under ``stamp``: the whole file's (written as heaps), with the log's
        first ``log_bytes`` applied (pushed entries added, popped sequence numbers removed);
        None if either file fails its stamp or is shorter than vouched."""
        try:
            stored = pickle.loads(Path(self._timers_path("pkl")).read_bytes())  # (a file this executor wrote)
            if not (isinstance(stored, tuple) and len(stored) == 3 and stored[0] == stamp):
                return None
            queues = [LoggedQueue(stored[1]), LoggedQueue(stored[2])]
            if log_bytes:
                with open(self._timers_path("log"), "rb") as f:
                    frames = f.read(log_bytes)
                if len(frames) != log_bytes:
                    return None
                # A call pops every entry due by its end, and an entry pushed due is popped in the
                # same call (bucket.py _fire): replayed frame by frame, a frame's popped entries are
                # then the heap's smallest after its pushes. Any that are not are removed at the end.
                stray: list[set] = [set(), set()]
                view = io.BytesIO(frames)
                while view.tell() < log_bytes:
                    frame = pickle.load(view)
                    if frame[0] != stamp:
                        return None
                    for i, queue in enumerate(queues):
                        for entry in frame[1 + i]:
                            heapq.heappush(queue, entry)
                        gone = set(frame[3 + i])
                        while gone and queue and queue[0][1] in gone:
                            gone.discard(heapq.heappop(queue)[1])
                        stray[i] |= gone
                for i, left in enumerate(stray):
                    if left:
                        queues[i] = LoggedQueue(e for e in queues[i] if e[1] not in left)
                        heapq.heapify(queues[i])
        except Exception:  # noqa: BLE001 - cut short or unreadable: rebuilt
            return None
        return queues

    def store_timers(self, tag: str, event: Any, processing: Any, rewrite: bool) -> None:
        """Vouch for the timer queues at copy version ``tag``. With ``rewrite`` (they
        changed): the queues read from this copy (:class:`LoggedQueue`) append one frame of
        their changes to ``timers.log``; queues rebuilt, or a log grown past the whole
        file's size, are written whole under a new stamp. Without it: the ones :meth:`timers`
        read or this call last wrote (only the tag line is rewritten, with the queues'
        lengths and earliest times)."""
        os.makedirs(self.dir, exist_ok=True)
        stamp = getattr(self, "_timers_stamp", None)
        logged = getattr(self, "_timers_logged", 0)
        queues = [event, processing]
        if rewrite or stamp is None:
            frame = self._changes(stamp, queues) if stamp is not None else None
            log = self._timers_path("log")
            if (frame is not None and _size(log) >= logged
                    and logged + len(frame) <= max(self.TIMER_LOG_MIN, _size(self._timers_path("pkl")))):
                with open(log, "ab") as f:
                    f.truncate(logged)  # (frames a failed call appended past what the tag vouched for)
                    f.write(frame)
                logged += len(frame)
            else:
                queues = [q.load() if isinstance(q, StoredQueue) else q for q in queues]
                stamp, logged = secrets.token_hex(8), 0
                tmp = self._timers_path("pkl") + ".tmp"
                with open(tmp, "wb") as f:
                    pickle.dump((stamp, *(list(q) for q in queues)), f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, self._timers_path("pkl"))
                open(log, "wb").close()  # (the tag line vouches for none of it now)
            for q in queues:
                if isinstance(q, LoggedQueue):
                    q.pushed, q.popped = [], []  # (written: a second store of this call adds only what follows)
            assert stamp is not None
            self._timers_stamp, self._timers_logged = stamp, logged
        sizes = " ".join(f"{len(q)} {int(q[0][0]) if q else 0}" for q in queues)
        tmp = self._timers_path("tag") + ".tmp"
        Path(tmp).write_text(f"{tag} {BOOT_ID} {stamp} {logged} {sizes}")
        os.replace(tmp, self._timers_path("tag"))

    @staticmethod
    def _changes(stamp: str, queues: list[Any]) -> bytes | None:
        """One log frame of what the call changed in ``queues`` (each a :class:`LoggedQueue`
        read from this copy, or a :class:`StoredQueue` never read: unchanged); None if a
        queue came from elsewhere (rebuilt from the slots), so its changes are not known."""
        if not all(isinstance(q, (LoggedQueue, StoredQueue)) for q in queues):
            return None
        pushed = [q.pushed if isinstance(q, LoggedQueue) else [] for q in queues]
        popped = [q.popped if isinstance(q, LoggedQueue) else [] for q in queues]
        return pickle.dumps((stamp, *pushed, *popped), protocol=pickle.HIGHEST_PROTOCOL)

    def rebuild_timers(self, overflow: dict[Any, Any], n: int) -> tuple[list, list, int]:
        """The timer queues from the slots themselves (each key's slot holds its timers):
        only entries holding a timer name are unpickled (their bytes found by one scan of
        the heap). Timers due at the same time are queued by key hash. Returns the event and
        processing-time queues and the next sequence number after ``n``."""
        from ember.runner.spark.keyed.runtime import EVENT_TIMERS, PROCESSING_TIMERS

        kinds = (EVENT_TIMERS, PROCESSING_TIMERS)
        found: list[tuple[int, Any, dict[str, Any]]] = []
        if len(self.keys):
            starts, lengths = np.asarray(self.offsets), np.asarray(self.lengths)
            order = np.argsort(starts, kind="stable")
            ordered = starts[order]
            data = self.heap
            hits: set[int] = set()
            for kind in kinds:  # (pickle writes a slot's name whole: a slot with timers holds it)
                for match in re.finditer(re.escape(kind.encode()), data):
                    i = int(np.searchsorted(ordered, match.start(), side="right")) - 1
                    if i >= 0 and match.start() < int(ordered[i]) + int(lengths[order[i]]):
                        hits.add(int(order[i]))
            for j in sorted(hits):
                key, slot = pickle.loads(data[int(starts[j]):int(starts[j]) + int(lengths[j])])
                found.append((int(self.keys[j]), key, slot))
        if overflow:
            found += [(int(h), key, slot) for h, (key, slot) in zip(key_hashes(list(overflow)).tolist(), overflow.items())]
        queues: list[list] = []
        for kind in kinds:
            due = sorted(((int(ts), h, key) for h, key, slot in found for ts in slot.get(kind, ())), key=lambda t: t[:2])
            queues.append([(ts, n + i + 1, key) for i, (ts, _h, key) in enumerate(due)])  # (sorted: a heap)
            n += len(due)
        return queues[0], queues[1], n

    def column_slices(self, start: int, stop: int) -> list[Any]:
        """Rows ``start:stop`` as columns (a compaction writes the live table in parts)."""
        offs, lens = self.offsets[start:stop].tolist(), self.lengths[start:stop].tolist()
        return [pa.array([self.heap[o:o + n] for o, n in zip(offs, lens)], pa.binary())]

    def __len__(self) -> int:
        return len(self.keys)


class StoredQueue:
    """A timer queue of a delta-layout bucket as ``timers.tag`` describes it: its length and
    earliest time, enough to tell whether anything is due; :meth:`load` reads the queue itself
    (before the runtime pushes or pops: KeyedRuntime.timer_queue)."""

    def __init__(self, length: int, head: int, load: Any) -> None:
        self.length, self.head, self.load = length, head, load

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int]:
        if index != 0 or not self.length:
            raise IndexError("only a stored queue's earliest entry is known before it is loaded")
        return (self.head,)


class LoggedQueue(list):
    """A timer queue read from a delta-layout copy: a heap (a list, for ``heapq``) that also
    notes the entries a call pushes (KeyedRuntime._register) and the sequence numbers it pops
    (BucketFunction._fire), so :meth:`SlotTable.store_timers` appends only those to the log."""

    def __init__(self, entries: Iterable[Any] = ()) -> None:
        super().__init__(entries)
        self.pushed: list[Any] = []
        self.popped: list[int] = []


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _binary_buffers(values: pa.Array) -> tuple[np.ndarray, bytes]:
    """An Arrow binary array's offsets (int64, n + 1, from 0) and its data bytes."""
    values = values.cast(pa.large_binary()) if values.type != pa.large_binary() else values
    if len(values) == 0:
        return np.zeros(1, np.int64), b""
    _validity, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=len(values) + 1, offset=values.offset * 8)
    start, stop = int(offsets[0]), int(offsets[-1])
    return offsets - start, data_buf.to_pybytes()[start:stop] if data_buf is not None else b""


class DeltaLog:
    """The Spark-side half of one bucket's state, as seen by one call: its ``ListState`` of
    parts and ``ValueState`` version (handles of ``transformWithStateInPandas``), and the
    bucket's working copy. :meth:`open` makes the copy current; :meth:`read` and
    :meth:`write` are the table a vectorised function sees."""

    def __init__(self, parts: Any, version: Any, local: Any, bucket: int, fields: list[str]) -> None:
        self.parts_state, self.version_state, self.local, self.fields = parts, version, local, fields
        self.bucket = bucket
        self.version = Version()
        self.rebuilt_rows = -1  # rows folded when the call had to rebuild the copy (-1: it did not)
        self.appended_bytes = 0  # what this call appended to the log, compactions apart (the benchmark's counters)
        self.compacted_bytes = 0
        self.changed_keys = 0
        self._lock_fd = -1  # the held copy's lock (see _claim_copy)
        self.private: str | None = None  # a private copy, when another call held the bucket's

    def open(self) -> None:
        self._claim_copy()
        self.version = Version.of(self.version_state.get())
        if self.version.tag and self.local.tag() == self.version.tag:
            self.local.load()
            return
        keys, columns = fold_parts((row[0] for row in self.parts_state.get()), self.fields, self.local.types) \
            if self.version.tag else (np.empty(0, np.int64), [_empty(t) for t in self.local.types])
        self.rebuilt_rows = len(keys)
        self.local.replace(keys, columns, self.version.tag or "empty")

    def read(self, keys: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        return self.local.lookup(keys)

    def write(self, keys: np.ndarray, columns: list[Any], deleted: np.ndarray) -> None:
        """Record changed rows (``keys`` sorted, unique): in the log, the version and the copy."""
        if not len(keys):
            return
        tag = new_tag()
        self.local.apply(keys, columns, deleted, tag)
        live = len(self.local)
        parts, logged = self.version.parts + 1, self.version.logged + len(keys)
        stagger = (self.bucket % 8) / 8  # buckets of a uniform key space reach the threshold apart
        if logged > max(COMPACT_MIN_ROWS, (COMPACT_FACTOR + stagger) * live):
            compacted = [encode_part(np.asarray(self.local.keys[i:i + PART_ROWS]), self.local.column_slices(i, i + PART_ROWS),
                                     np.zeros(min(PART_ROWS, live - i), bool), self.fields) for i in range(0, max(live, 1), PART_ROWS)]
            self.parts_state.put([(p,) for p in compacted])
            parts, logged = len(compacted), live
            self.compacted_bytes += sum(len(p) for p in compacted)
        else:
            part = encode_part(keys, columns, deleted, self.fields)
            self.parts_state.appendList([(part,)])
            self.appended_bytes += len(part)
        self.changed_keys += len(keys)
        self.version = Version(tag, parts, logged, live)
        self.version_state.update(self.version.row())

    def _claim_copy(self) -> None:
        """Hold the bucket's working copy for this call (an exclusive ``flock`` on
        ``<copy>.lock``). Spark runs one task per state partition and batch, but a second
        attempt may overlap the first (a zombie task of an executor declared lost, a
        speculative copy): the call that finds the copy held works on a private copy,
        rebuilt from the log and removed when the call ends, so neither sees the other's
        half-written columns."""
        import fcntl

        parent = os.path.dirname(self.local.dir) or "."
        os.makedirs(parent, exist_ok=True)
        self._lock_fd = os.open(self.local.dir + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            self.private = tempfile.mkdtemp(prefix=os.path.basename(self.local.dir) + ".attempt-", dir=parent)
            self.local.dir = self.private

    def close(self) -> None:
        self.local.close()
        if self.private is not None:
            import shutil

            shutil.rmtree(self.private, ignore_errors=True)
            self.private = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1


def key_hashes(keys: Any) -> np.ndarray:
    """The working copy's index of each key: an integer key itself, else a 64-bit hash that
    is the same in every process (pandas' SipHash with its fixed key over ``str(key)`` —
    not Python's ``hash``, which differs per process). Distinct keys may share a hash:
    :class:`DeltaKeys` checks the key stored with each slot."""
    values = keys if isinstance(keys, np.ndarray) else _column(list(keys))
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    import pandas as pd

    hashes = pd.util.hash_array(values.astype(object)).view(np.int64)
    ints = [i for i, k in enumerate(values.tolist()) if type(k) is int and -(1 << 63) <= k < (1 << 63)]
    if ints:  # an int among other keys: its own value, as in a column of ints (one key, one hash)
        hashes[ints] = values[ints].astype(np.int64)
    return hashes


class DeltaKeys(dict):
    """A process function's bucket table (``blob["keys"]``: key -> slot) on design B: the
    slots a call needs are loaded from the working copy — a frame's keys at once
    (:meth:`prefetch`; the hot loop then reads the dict directly), a timer's key when it
    fires — and :meth:`changes` says which of them the call changed (their pickled bytes
    differ) or removed, in time proportional to the keys that have state, not to the keys
    looked up. Iterating it (TTL's expiry pass) sees the loaded keys: those the call read
    and, with TTL, a slice of the rest (:meth:`sweep`), so expired state of keys never read
    again is removed within about 64 calls of the bucket (cells also check TTL on read).

    The copy is indexed by :func:`key_hashes`; each entry holds ``(key, slot)`` pickled. A
    key whose hash belongs to another key (a collision: ~1e-10 per bucket at 10 M keys, but
    never wrong) keeps its slot in ``overflow``, a dict in the bucket's blob beside the timers."""

    def __init__(self, log: DeltaLog, overflow: dict[Any, Any] | None = None) -> None:
        super().__init__()
        self.log = log
        self.overflow = overflow if overflow is not None else {}
        self.known: set[Any] = set()  # every key looked up
        self.stored: dict[Any, tuple[int, bytes]] = {}  # those that own their hash's entry: (hash, stored bytes)
        self.taken: dict[int, Any] = {}  # hash -> the key that owns its entry (among those seen)
        self.hashes: dict[Any, int] = {}  # every key looked up -> its hash (computed once, with its batch)
        self.all_loaded = False  # load_all() ran in this call

    def prefetch(self, keys: Iterable[Any]) -> None:
        if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":  # (integers: no nulls)
            wanted: list[Any] = np.unique(keys).tolist()
        else:
            wanted = list(dict.fromkeys(k for k in keys if k is not None and k == k))  # (no null or NaN key)
        if self.known:
            wanted = [k for k in wanted if k not in self.known]
        if not wanted:
            return
        self.known.update(wanted)
        hashes = key_hashes(_column(wanted))
        order = np.argsort(hashes, kind="stable")
        unique = np.unique(hashes)
        found, (blobs,) = self.log.read(unique)
        entries = dict(zip(found.tolist(), blobs))
        self._load(entries)
        for i in order.tolist():
            key, h = wanted[i], int(hashes[i])
            self.hashes[key] = h
            owner = self.taken.setdefault(h, key)  # nobody has it yet: this key takes it
            if owner != key or key not in self.stored:
                if key in self.overflow:  # a collided key (its entry's owner may have gone since)
                    dict.__setitem__(self, key, self.overflow[key])

    def _load(self, entries: dict[int, bytes]) -> None:
        """Entries of the copy read for the call: each owner's slot into the table."""
        loads, put = pickle.loads, dict.__setitem__
        for h, b in entries.items():
            if h in self.taken and self.taken[h] in self.stored:
                continue
            key, slot = loads(b)
            self.taken[h] = key
            self.stored[key] = (h, b)
            self.known.add(key)
            put(self, key, slot)

    SWEEP_SHARE, SWEEP_MIN = 64, 1024  # a TTL sweep loads 1/64 of a bucket's keys (at least 1,024) per call

    def sweep(self, cursor: int) -> int:
        """Load the next slice of the copy's entries, from hash ``cursor`` on (wrapping), and
        the overflow's keys, so the TTL expiry pass (runtime.expire) sees them even if no
        record reads them again; returns where the next call goes on (a hash, so entries
        added or removed meanwhile do not make it skip any). Every entry is visited within
        about SWEEP_SHARE calls."""
        index = self.log.local.keys
        n = len(index)
        if not n:
            self._load_stored(index)
            return 0
        start = int(np.searchsorted(index, cursor))
        if start >= n:
            start = 0
        chunk = np.asarray(index[start:start + max(self.SWEEP_MIN, n // self.SWEEP_SHARE)])
        self._load_stored(chunk)
        last = int(chunk[-1])
        return last + 1 if start + len(chunk) < n and last < np.iinfo(np.int64).max else int(np.iinfo(np.int64).min)

    def load_all(self) -> None:
        """Load every key of the bucket (``apply_to_keyed_state`` reaches them all): the
        copy's whole index and the overflow's keys — O(the bucket's keys), once per call
        (every key is known after it; keys added later are in the table already)."""
        if not self.all_loaded:
            self._load_stored(np.asarray(self.log.local.keys))
            self.all_loaded = True

    def _load_stored(self, hashes: np.ndarray) -> None:
        """Load the copy's entries of ``hashes`` (sorted) and the overflow's keys (as any
        lookup: from the overflow, with their hashes)."""
        if self.overflow:
            self.prefetch(list(self.overflow))
        if len(hashes):
            found, (blobs,) = self.log.read(hashes)
            self._load(dict(zip(found.tolist(), blobs)))

    def get(self, key: Any, default: Any = None) -> Any:
        if key not in self.known:
            self.prefetch((key,))
        return dict.get(self, key, default)

    def __getitem__(self, key: Any) -> Any:
        if key not in self.known:
            self.prefetch((key,))
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        if key not in self.known:
            self.prefetch((key,))
        return dict.__contains__(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self.known:
            self.prefetch((key,))
        dict.__setitem__(self, key, value)

    def changes(self) -> tuple[np.ndarray, list[bytes | None]]:
        """The entries (hashes, sorted) the call changed or removed, and their new bytes
        (None: removed); the overflow is updated in place (it is stored with the blob)."""
        out: dict[int, bytes | None] = {}
        dumps, get, stored, taken, overflow = pickle.dumps, dict.get, self.stored, self.taken, self.overflow
        candidates = set(stored) | set(dict.keys(self)) | (set(overflow) & self.known)
        for key in candidates:
            slot = get(self, key)
            h = stored[key][0] if key in stored else None
            if h is None:  # no entry of its own yet: its hash's entry, if free, or the overflow
                hk = self.hashes[key]  # (every key in the table was looked up first)
                if taken.get(hk, key) == key and hk not in out:
                    h = hk
            if h is None:
                if slot is None:
                    overflow.pop(key, None)
                else:
                    overflow[key] = slot
                continue
            overflow.pop(key, None)  # (a collided key whose hash became free moves to its entry)
            if slot is None:
                if key in stored:
                    out[h] = None
                continue
            now = dumps((key, slot), protocol=pickle.HIGHEST_PROTOCOL)
            if key not in stored or now != stored[key][1]:
                out[h] = now
                taken[h] = key
        hashes = sorted(out)
        return np.array(hashes, dtype=np.int64), [out[h] for h in hashes]

    def flush(self) -> None:
        """Write what changed to the log, the version and the working copy."""
        keys, blobs = self.changes()
        if len(keys):
            deleted = np.array([b is None for b in blobs], bool)
            self.log.write(keys, [pa.array([b or b"" for b in blobs], pa.binary())], deleted)


def _column(keys: list[Any]) -> np.ndarray:
    """Keys as a numpy column: int64 for Python ints, else objects (tuples stay whole)."""
    if all(type(k) is int for k in keys):
        try:
            return np.asarray(keys, dtype=np.int64)
        except OverflowError:
            pass
    column = np.empty(len(keys), dtype=object)
    column[:] = keys
    return column
