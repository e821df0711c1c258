"""Which state buckets a batch's packing must reach, for a step that advances its
watermark within the batch (bucket.py, ``advance_ms``).

Such a step fires in the batch what the batch's latest event time makes due, so a
bucket's call must know that time, and a bucket with a due timer must be called though
no record of the batch falls into it. Sending every one of the 128 buckets a row costs
128 calls per batch, a few ms each in pyspark's per-group conversion, whatever the key
count (docs/design/latency.md). Two things let the packing send fewer:

- **Quiet marks.** A bucket whose call ends with no timer at all leaves a mark
  ``<bucket>.<batch>.<run>`` in the step's folder of the checkpoint
  (``ember/quiet/<step>``); a call that ends with a timer removes it. A quiet bucket
  called without records would do nothing (no timer to fire, no state written), so
  the packing leaves it out unless it has records. A mark is believed only when the
  query run that reads it wrote it, in an earlier batch: a mark left by an attempt that
  failed (a crash, then a new run; or a task retried within the batch) is not, so its
  bucket is called and marked again. Without a mark, a bucket is called.
- **The first bucket of each state partition.** Spark calls a task's buckets in
  ascending order (the operator sorts its input by the grouping key), and each
  partition's lowest bucket always gets a row from every packing partition, so the
  task's first call sees the batch's latest time and the task remembers it for its
  later calls (:class:`TaskLatest`): a bucket with records from one partition only still
  learns the other partitions' latest time.

Spark's batch id, run id and state partition count reach every task as local
properties; without them the packing falls back to every bucket. The checkpoint must be
on storage every executor sees, as for chained steps (datasources.batch_watermark).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

__all__ = ["Reach", "QuietMarks", "TaskLatest", "first_buckets", "spark_hash_int"]

# Spark's local properties of a micro-batch's tasks
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # the micro-batch's id (on every job of the batch)
RUN_ID = "spark.jobGroup.id"  # the query run's id (a new one on every start)
STATE_PARTITIONS = "spark.sql.streaming.internal.stateStore.partitions"

_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an int (Murmur3 x86 32-bit, ``Murmur3_x86_32.hashInt``), signed:
    the hash Spark's hash partitioning places a row with."""
    k1 = (value & _M32) * 0xCC9E2D51 & _M32
    k1 = _rotl32(k1, 15) * 0x1B873593 & _M32
    h1 = _rotl32((seed & _M32) ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _M32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _M32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


@lru_cache(maxsize=16)
def first_buckets(buckets: int, partitions: int) -> frozenset[int]:
    """The lowest bucket of each state partition (Spark places bucket ``b`` in partition
    ``pmod(hash(b), partitions)``): each partition's first call."""
    firsts: dict[int, int] = {}
    for b in range(buckets):
        firsts.setdefault(spark_hash_int(b) % partitions, b)  # Python's % of a positive modulus is pmod
    return frozenset(firsts.values())


def _task_properties() -> tuple[int, str, int] | None:
    """(batch id, run id, state partitions) of the micro-batch this task runs in, or None."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    batch, run, parts = (context.getLocalProperty(k) for k in (BATCH_ID_PROPERTY, RUN_ID, STATE_PARTITIONS))
    if batch is None or not run or parts is None:
        return None
    return int(batch), run, int(parts)


def _marks(directory: str) -> dict[int, list[tuple[int, str, str]]]:
    """The marks in ``directory``: bucket -> [(batch, run, file name)]."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    found: dict[int, list[tuple[int, str, str]]] = {}
    for name in names:
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            found.setdefault(int(parts[0]), []).append((int(parts[1]), parts[2], name))
    return found


@dataclass(frozen=True)
class Reach:
    """The buckets every packing partition sends a row (its latest event time) in a batch:
    all ``buckets``, or, with the step's quiet-marks folder ``marks``, every bucket but the
    quiet ones, and always each state partition's first. Picklable; read in the tasks."""

    buckets: int
    marks: str | None = None

    def targets(self) -> Iterable[int]:
        every = range(self.buckets)
        task = _task_properties() if self.marks is not None else None
        if task is None or self.marks is None:  # (marks None: no task properties read)
            return every
        batch, run, partitions = task
        quiet = {b for b, found in _marks(self.marks).items()
                 if any(r == run and t < batch for t, r, _ in found)}
        if not quiet:
            return every
        firsts = first_buckets(self.buckets, partitions)
        return [b for b in every if b not in quiet or b in firsts]


class QuietMarks:
    """The writing side of the quiet marks, one per task: after each call, the bucket's mark
    is made (no timer left) or removed (a timer left)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._known: dict[int, list[tuple[int, str, str]]] | None = None
        self._task: tuple[int, str, int] | None = None

    def note(self, bucket: int, quiet: bool) -> None:
        if self._known is None:  # the task's first call: its buckets' marks change only through this task
            self._known, self._task = _marks(self.directory), _task_properties()
        found = self._known.get(bucket, [])
        if not quiet:
            for _, _, name in found:
                try:
                    os.remove(os.path.join(self.directory, name))  # an error fails the task: a stale mark would hide a timer
                except FileNotFoundError:
                    pass
            self._known.pop(bucket, None)
            return
        if self._task is None:
            return
        batch, run, _ = self._task
        if any(r == run for _, r, _ in found):
            return  # marked in this run already (an earlier batch, or this one's failed attempt)
        name = f"{bucket}.{batch}.{run}"
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(os.path.join(self.directory, name), "w"):
                pass
        except OSError:
            return  # unmarked: the bucket stays called every batch
        for _, _, old in found:
            try:
                os.remove(os.path.join(self.directory, old))
            except OSError:
                pass  # an earlier run's mark is never believed
        self._known[bucket] = [(batch, run, name)]


class TaskLatest:
    """The latest event time a task's calls have seen in its batch: a bucket reached by some
    packing partitions only learns the others' latest time from the task's first call."""

    def __init__(self) -> None:
        self._task: Any = None
        self._latest: int | None = None

    def __call__(self, latest: int | None) -> int | None:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            return latest
        task = (context.getLocalProperty(BATCH_ID_PROPERTY), context.partitionId(), context.attemptNumber())
        if task != self._task:
            self._task, self._latest = task, None
        if latest is not None and (self._latest is None or latest > self._latest):
            self._latest = latest
        return self._latest
