"""Drives one state bucket of a keyed step through micro-batches the way Spark does —
event time, the watermark a batch behind — without Spark (for the CEP step's tests)."""

from __future__ import annotations

import pickle
import random

import pandas as pd

from ember.runner.spark.keyed.bucket import BucketFunction


class BucketState:
    """Spark's group state for one bucket, with the watermark of the batch."""

    def __init__(self, blob, watermark):
        self.blob, self.watermark = blob, watermark

    exists = property(lambda self: self.blob is not None)
    get = property(lambda self: (self.blob,))

    def update(self, value):
        self.blob = value[0]

    def getCurrentWatermarkMs(self):  # noqa: N802 - Spark's names
        return self.watermark

    def getCurrentProcessingTimeMs(self):  # noqa: N802
        return 0

    def setTimeoutTimestamp(self, ts):  # noqa: N802
        pass

    def setTimeoutDuration(self, ms):  # noqa: N802
        pass


def drive(fn, data, fields, output, side_outputs, bound, in_batch=False):
    """Runs keyed function ``fn`` (key ``k``, event time ``ts``) over ``data`` (a list of
    batches of record dicts with ``fields``), then an end of input that makes everything
    due: (every output frame concatenated, the bucket's final state or None). ``in_batch``:
    the step advances its watermark within each batch (the job's only stateful step, as on
    Spark), and gets the batch's records in two frames (Spark's Arrow batches, in arrival
    order: a record of the second may be earlier than one of the first)."""
    bucket_fn = BucketFunction(fn, "cep", ["k"], fields, output, "ts", True, side_outputs=side_outputs, counters={},
                               advance_ms=bound if in_batch else None)
    blob, spark_watermark, frames = None, 0, []  # Spark's watermark: max - bound (0 before any), Ember's 1 ms behind
    for batch in [*data, None]:
        inputs = [pd.DataFrame(batch, columns=fields)] if batch else []
        if in_batch and batch and len(batch) > 1:
            half = len(batch) // 2
            inputs = [pd.DataFrame(batch[:half], columns=fields), pd.DataFrame(batch[half:], columns=fields)]
        state = BucketState(blob, spark_watermark if batch is not None else 1 << 40)
        frames += list(bucket_fn(0, iter(inputs), state))
        blob = state.blob
        if batch:
            spark_watermark = max(spark_watermark, max(e["ts"] for e in batch) - bound)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=output)
    return out, pickle.loads(blob) if blob else None


def batches(seed, bound, poison=0.0):
    """Eight micro-batches of events of three keys, out of order within ``bound`` and some
    late; with ``poison``, that share of them has ``v = "?"`` (no number)."""
    rng = random.Random(seed)
    out, front, n = [], 0, 0
    for _ in range(8):
        front += rng.randint(1, 5)
        batch = []
        for _ in range(rng.randint(0, 9)):
            n += 1
            ts = max(front - rng.randint(0, bound + 2), 0)
            batch.append({"k": rng.choice("xyz"), "ts": ts, "t": rng.choice("aabbccde"),
                          "v": "?" if poison and rng.random() < poison else rng.randint(0, 9), "n": n % 100})
        out.append(batch)
    return out
