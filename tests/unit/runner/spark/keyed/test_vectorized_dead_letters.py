"""``process_batches(fn, schema, dead_letter=tag)``: a failing call is narrowed down by keys
(keyed/vectorized.py ``_by_keys``). Checked against a plain model over random batches: the
keys whose records of a batch make the function raise send all those records to the dead
letters and keep their state; every other key's output and state are as without them."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pandas as pd
import pytest

from ember.functions import VectorizedKeyedFunction
from ember.runner.spark.keyed.runtime import TAG, side_column
from ember.runner.spark.keyed.vectorized import make_vectorized_bucket_function


class _State:
    """Spark's GroupState as the blob table uses it."""

    def __init__(self, blob):
        self.blob = blob

    exists = property(lambda self: self.blob is not None)
    get = property(lambda self: (self.blob,))

    def update(self, value):
        self.blob = value[0]

    def remove(self):
        self.blob = None

    def getCurrentWatermarkMs(self):  # noqa: N802 - Spark's name
        return 0

    def getCurrentProcessingTimeMs(self):  # noqa: N802
        return 0


class Totals(VectorizedKeyedFunction):
    """Per key a running total of x; raises when any record of the call has a negative x."""

    state_schema = "total bigint"

    def __init__(self, keys):
        self.keys = keys

    def process_batch(self, events, state, ctx):
        if (events["x"] < 0).any():
            raise ValueError("negative amount")
        index = pd.MultiIndex.from_frame(events[self.keys]) if len(self.keys) > 1 else pd.Index(events[self.keys[0]])
        totals = state["total"].astype("float64").reindex(index).fillna(0).to_numpy()
        running = events.groupby(self.keys, sort=False)["x"].cumsum().to_numpy() + totals
        out = events[self.keys + ["ts"]].assign(total=running.astype("int64"))
        last = out.groupby(self.keys, sort=False).tail(1).set_index(self.keys)
        return out, last[["total"]]


def _model(batches, keys):
    state, outputs, dead = {}, [], []
    for batch in batches:
        by_key = {}
        for row in sorted(batch, key=lambda r: (tuple(r[k] for k in keys), r["ts"])):
            by_key.setdefault(tuple(row[k] for k in keys), []).append(row)
        for key, rows in by_key.items():
            if any(r["x"] < 0 for r in rows):
                dead += rows
                continue
            for r in rows:
                state[key] = state.get(key, 0) + r["x"]
                outputs.append((*key, r["ts"], state[key]))
    return sorted(outputs), sorted(json.dumps(r, sort_keys=True) for r in dead)


@pytest.mark.parametrize("keys", [["k"], ["k", "j"]])
@pytest.mark.parametrize("seed", range(6))
def test_failing_keys_are_dead_letters_and_the_others_run_as_without_them(seed, keys):
    rng = random.Random(seed)
    batches = [[{"ts": 100 * b + i, "k": rng.choice("abcdefgh"), "j": rng.randint(0, 1),
                 "x": -1 if rng.random() < 0.04 else rng.randint(0, 9)} for i in range(rng.randint(0, 40))]
               for b in range(5)]
    fields = ["ts", "k", "j", "x"]
    out_fields = keys + ["ts", "total"]
    run = make_vectorized_bucket_function(Totals(keys), "totals", keys, fields, ["total"], out_fields, None, False,
                                          dead_letter="bad")
    state, outputs, dead = _State(None), [], []
    for batch in batches:
        frames = [pd.DataFrame(batch, columns=fields)] if batch else []
        for frame in run((0,), iter(frames), state):
            for rec in frame.to_dict("records"):
                if rec[TAG] is None:
                    outputs.append(tuple(rec[f] for f in out_fields))
                else:
                    dead.append(json.dumps(json.loads(rec[side_column("bad", "raw")]), sort_keys=True))
                    assert rec[side_column("bad", "error")] == "step 'totals': Totals.process_batch raised ValueError: negative amount"
    expected_out, expected_dead = _model(batches, keys)
    assert sorted(outputs) == expected_out and sorted(dead) == expected_dead
    assert expected_dead or seed != 0, "seed 0 should bring bad records"
    table = pickle.loads(state.blob)  # the stored state: the model's, bad keys untouched
    assert {k if isinstance(k, tuple) else (k,): int(v) for k, v in table["total"].items()} == _last_totals(
        expected_out, len(keys))


def _last_totals(outputs, n_keys):
    last = {}
    for row in sorted(outputs, key=lambda r: (r[:n_keys], r[n_keys])):
        last[row[:n_keys]] = row[-1]
    return last


def test_without_a_tag_the_failure_fails_the_step():
    from ember.errors import UserFunctionError

    run = make_vectorized_bucket_function(Totals(["k"]), "totals", ["k"], ["ts", "k", "x"], ["total"], ["k", "ts", "total"],
                                          None, False)
    frame = pd.DataFrame({"ts": np.arange(3), "k": ["a", "b", "a"], "x": [1, -1, 2]})
    with pytest.raises(UserFunctionError, match="step 'totals': Totals.process_batch raised ValueError: negative amount"):
        list(run((0,), iter([frame]), _State(None)))
