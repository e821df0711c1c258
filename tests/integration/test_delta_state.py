"""state_layout="delta" on Spark (keyed/delta.py, issue 18): a vectorised step keeps a log of
changed rows in Spark's state store and its table on the executor's disk. Results equal an
independent model across batches and restarts — also when the working copy is gone and must
be rebuilt from the log — and layout changes and unsupported steps are refused before the
job starts."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pandas as pd
import pytest

from ember import CollectSink, PipelineError, ScriptedSource, StreamEnvironment, WatermarkStrategy
from ember.functions import VectorizedKeyedFunction
from ember.runner.spark.keyed.delta import local_state_root, step_directory
from ember.runner.spark.restart import RestartError

pytestmark = pytest.mark.spark

LIMIT = 60  # a key whose total reaches it is deleted (its state row set to nulls)


class Totals(VectorizedKeyedFunction):
    """Per key: a running total of x and a count; each record out with the total so far."""

    state_schema = "total bigint, n int"

    def process_batch(self, events, state, ctx):
        keys = events["k"].to_numpy()
        prior = state["total"].reindex(keys).fillna(0).to_numpy()
        prior_n = state["n"].reindex(keys).fillna(0).to_numpy()
        running = events.groupby("k", sort=False)["x"].cumsum().to_numpy() + prior
        order = events.groupby("k", sort=False).cumcount().to_numpy() + 1 + prior_n
        out = pd.DataFrame({"k": keys, "ts": events["ts"], "total": running.astype("int64"), "n": order.astype("int64")})
        last = out.groupby("k", sort=False).tail(1).set_index("k")
        updates = last[["total", "n"]].astype("float64")
        updates.loc[updates["total"] >= LIMIT] = np.nan  # a row of nulls deletes the key's state
        return out, updates


OUT = "k bigint, ts bigint, total bigint, n bigint"


def model(batches):
    """The independent model: per batch, each key's records in timestamp order."""
    totals: dict[int, tuple[int, int]] = {}
    out = []
    for batch in batches:
        for ts, k, x in sorted(batch):
            total, n = totals.get(k, (0, 0))
            totals[k] = (total + x, n + 1)
            out.append((k, ts, total + x, n + 1))
        totals = {k: v for k, v in totals.items() if v[0] < LIMIT}
    return out


def random_batches(seed: int, n_batches: int, keys: int):
    rng = np.random.default_rng(seed)
    ts, batches = 0, []
    for _ in range(n_batches):
        batch = []
        for _ in range(int(rng.integers(1, 40))):
            ts += 1
            batch.append((ts, int(rng.integers(-keys, keys)), int(rng.integers(1, 10))))
        rng.shuffle(batch)
        batches.append(batch)
    return batches


def run(spark, tmp_path, batches, layout="delta", key_type="bigint"):
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark, state_layout=layout)
    sink = CollectSink()
    (env.from_source(ScriptedSource(batches, f"ts bigint, k {key_type}, x bigint"),
                     WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
     .key_by("k").process_batches(Totals(), OUT, name="totals").sink_to(sink))
    result = env.execute("delta", progress=False)
    return sorted((r["k"], r["ts"], r["total"], r["n"]) for r in sink.rows()), result


def test_delta_layout_equals_the_model_across_restarts_and_rebuilds(spark, tmp_path):
    batches = random_batches(11, 9, 25)
    expected = model(batches)
    first, result = run(spark, tmp_path, batches[:4])
    assert first == sorted(e for e in expected if e[1] <= max(t for b in batches[:4] for t, _, _ in b))
    assert result.counters["state_changed_keys"] > 0 and result.counters["state_appended_bytes"] > 0
    copies = os.path.join(local_state_root(), step_directory(os.path.join(str(tmp_path), "delta"), "totals"))
    assert os.path.isdir(copies) and os.listdir(copies), "no working copy was written where the layout keeps it"
    second, _ = run(spark, tmp_path, batches[:6])  # a restart: the working copies are current
    shutil.rmtree(copies)  # the executor's disk lost: every bucket is rebuilt from its log in Spark's state
    third, result = run(spark, tmp_path, batches)
    assert result.counters["state_rebuilt_rows"] > 0
    assert sorted(first + second + third) == sorted(expected)


def test_a_layout_change_is_refused_on_restart(spark, tmp_path):
    batches = [[(1, 1, 5), (2, 2, 6)], [(3, 1, 1)]]
    run(spark, tmp_path, batches[:1], layout="blob")
    with pytest.raises(RestartError, match=r"'totals'.*one value per state bucket.*a log of changed rows"):
        run(spark, tmp_path, batches, layout="delta")


def test_a_step_the_layout_cannot_keep_is_refused_before_the_job_starts(spark, tmp_path):
    with pytest.raises(PipelineError, match=r"totals.*state_layout='delta'.*one integer field \(got string\)"):
        run(spark, tmp_path, [[(1, "a", 1)]], key_type="string")
