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
from ember.functions import KeyedProcessFunction, VectorizedKeyedFunction
from ember.runner.spark.keyed.delta import local_state_root, step_directory
from ember.runner.spark.restart import RestartError
from ember.savepoints import create_savepoint
from ember.state import ValueStateDescriptor

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


def model(batches, state=False, start=None):
    """The independent model: per batch, each key's records in timestamp order; the outputs,
    or with ``state`` each key's (total, n) at the end. ``start``: each key's (total, n) before."""
    totals: dict[int, tuple[int, int]] = dict(start or {})
    out = []
    for batch in batches:
        for ts, k, x in sorted(batch):
            total, n = totals.get(k, (0, 0))
            totals[k] = (total + x, n + 1)
            out.append((k, ts, total + x, n + 1))
        totals = {k: v for k, v in totals.items() if v[0] < LIMIT}
    return totals if state else out


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


class TotalsPerRecord(KeyedProcessFunction):
    """Totals, one record at a time with ValueState (cleared at LIMIT); with ``timer_ms`` also
    an event-time timer per record that reports the key's count when it fires."""

    def __init__(self, timer_ms=None):
        self.timer_ms = timer_ms

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value, ctx):
        total, n = self.total.value() + value["x"], self.n.value() + 1
        if total >= LIMIT:
            self.total.clear()
            self.n.clear()
        else:
            self.total.update(total)
            self.n.update(n)
        if self.timer_ms is not None:
            ctx.register_event_time_timer(ctx.timestamp + self.timer_ms)
        yield {"k": ctx.current_key, "ts": ctx.timestamp, "total": total, "n": n}

    def on_timer(self, timestamp, ctx):
        yield {"k": ctx.current_key, "ts": -timestamp, "total": self.total.value(), "n": self.n.value()}


def run(spark, tmp_path, batches, layout="delta", key_type="bigint", fn=None, name="delta", parallelism=2, from_savepoint=None):
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=parallelism, spark=spark, state_layout=layout)
    sink = CollectSink()
    keyed = (env.from_source(ScriptedSource(batches, f"ts bigint, k {key_type}, x bigint"),
                             WatermarkStrategy.for_monotonous_timestamps("ts"), name="events").key_by("k"))
    if fn is None:
        keyed.process_batches(Totals(), OUT, name="totals").sink_to(sink)
    else:
        keyed.process(fn, OUT, name="totals").sink_to(sink)
    result = env.execute(name, progress=False, from_savepoint=from_savepoint)
    return sorted((r["k"], r["ts"], r["total"], r["n"]) for r in sink.rows()), result


@pytest.mark.parametrize("per_record", [pytest.param(False, marks=pytest.mark.slow), True], ids=["process_batches", "process"])
def test_delta_layout_equals_the_model_across_restarts_and_rebuilds(spark, tmp_path, per_record):
    batches = random_batches(11, 9, 25)
    expected = model(batches)
    fn = TotalsPerRecord() if per_record else None
    first, result = run(spark, tmp_path, batches[:4], fn=fn)
    assert first == sorted(e for e in expected if e[1] <= max(t for b in batches[:4] for t, _, _ in b))
    assert result.counters["state_changed_keys"] > 0 and result.counters["state_appended_bytes"] > 0
    copies = os.path.join(local_state_root(), step_directory(os.path.join(str(tmp_path), "delta"), "totals"))
    assert os.path.isdir(copies) and os.listdir(copies), "no working copy was written where the layout keeps it"
    second, _ = run(spark, tmp_path, batches[:6], fn=fn)  # a restart: the working copies are current
    shutil.rmtree(copies)  # the executor's disk lost: every bucket is rebuilt from its log in Spark's state
    third, result = run(spark, tmp_path, batches, fn=fn)
    assert result.counters["state_rebuilt_rows"] > 0
    # The input ended in an earlier run: no end-of-input row comes, nothing waits for one.
    assert result.stopped_because == "sources ended"
    assert sorted(first + second + third) == sorted(expected)
    # The state as a savepoint reads it (the log folded per bucket) is the model's.
    point = create_savepoint(os.path.join(str(tmp_path), "delta"), root=str(tmp_path / "sp"))
    state = point.read_state("totals", spark)
    final = model(batches, state=True)
    if per_record:
        want = sorted([(k, "n", n) for k, (_, n) in final.items()] + [(k, "total", t) for k, (t, _) in final.items()])
        assert sorted(state.itertuples(index=False, name=None)) == want
    else:
        assert sorted(state[["k", "total", "n"]].itertuples(index=False, name=None)) == sorted(
            (k, t, n) for k, (t, n) in final.items())
    # Rescaled from 2 to 3 state partitions (Spark moves each bucket's log; the working copies,
    # kept per bucket, stay valid): the job goes on as the model does.
    more = [[(ts + 1_000, k, x) for ts, k, x in b] for b in random_batches(12, 3, 25)]
    rescaled, _ = run(spark, tmp_path, batches + more, fn=fn, name="rescaled", parallelism=3, from_savepoint=point.path)
    assert rescaled == sorted(e for e in model(batches + more) if e[1] > 1_000)


def _edited(totals: dict[int, tuple[int, int]], new_key: int) -> dict[int, tuple[int, int]]:
    """The state a written savepoint holds: every other key dropped, the rest halved and
    counted from 100, and ``new_key`` added."""
    kept = {k: (t // 2, n + 100) for i, (k, (t, n)) in enumerate(sorted(totals.items())) if i % 2 == 0}
    return {**kept, new_key: (7, 1_000)}


@pytest.mark.parametrize("per_record", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["process_batches", "process"])
def test_written_state_on_the_delta_layout_restores_exactly(spark, tmp_path, per_record):
    """write_state on a delta-layout step (its log rewritten as one compacted part per bucket
    with a new version): the restored job, rescaled 2 -> 3, goes on from the written state as
    the model does — also when the machine still holds working copies of the state before the
    write, which must not be trusted."""
    batches = random_batches(21, 7, 12)
    fn = TotalsPerRecord() if per_record else None
    run(spark, tmp_path, batches[:3], fn=fn)
    point = create_savepoint(os.path.join(str(tmp_path), "delta"), root=str(tmp_path / "sp"))
    before = model(batches[:3], state=True)
    later = {k for b in batches[3:] for _, k, _ in b}
    new_key = min(later - set(before))  # a key the state lacks that the later input has
    want = _edited(before, new_key)
    if per_record:
        frame = pd.DataFrame([(k, name, v) for k, (t, n) in want.items() for name, v in (("n", n), ("total", t))],
                             columns=["k", "state", "value"])
    else:
        frame = pd.DataFrame([(k, t, n) for k, (t, n) in want.items()], columns=["k", "total", "n"])
    written = point.write_state("totals", frame, str(tmp_path / "sp" / "written"), spark)
    state = written.read_state("totals", spark)
    if per_record:
        assert sorted(state.itertuples(index=False, name=None)) == sorted(frame.itertuples(index=False, name=None))
    else:
        assert sorted(state[["k", "total", "n"]].itertuples(index=False, name=None)) == sorted(
            (k, t, n) for k, (t, n) in want.items())
    # The restored job's checkpoint gets the copies of the job the savepoint came from: were
    # the written version the old one, they would be taken as current and the edit lost.
    old_copies = os.path.join(local_state_root(), step_directory(os.path.join(str(tmp_path), "delta"), "totals"))
    assert os.listdir(old_copies)
    shutil.copytree(old_copies, os.path.join(local_state_root(), step_directory(os.path.join(str(tmp_path), "restored"), "totals")))
    # Restored on 3 state partitions (the savepoint has 2): Spark moves each bucket's rewritten log.
    restored, result = run(spark, tmp_path, batches, fn=fn, name="restored", parallelism=3, from_savepoint=written.path)
    assert result.counters["state_rebuilt_rows"] > 0
    last = max(t for b in batches[:3] for t, _, _ in b)
    assert restored == sorted(e for e in model(batches[3:], start=want))
    assert all(ts > last for _, ts, _, _ in restored)


@pytest.mark.slow
def test_timers_on_the_delta_layout_fire_as_on_the_blob_layout(spark, tmp_path):
    """Event-time timers (kept per bucket beside the log) across a restart with lost working
    copies: the same output as the blob layout's (itself tested against Flink's model)."""
    batches = random_batches(4, 7, 12)
    outputs = {}
    for layout in ("blob", "delta"):
        where = tmp_path / layout
        first, _ = run(spark, where, batches[:3], layout=layout, fn=TotalsPerRecord(timer_ms=3))
        shutil.rmtree(os.path.join(local_state_root(), step_directory(os.path.join(str(where), "delta"), "totals")),
                      ignore_errors=True)
        second, _ = run(spark, where, batches, layout=layout, fn=TotalsPerRecord(timer_ms=3))
        outputs[layout] = sorted(first + second)
    assert any(r[1] < 0 for r in outputs["blob"]), "no timer fired: the test does not test timers"
    assert outputs["delta"] == outputs["blob"]


def test_a_layout_change_is_refused_on_restart(spark, tmp_path):
    """(Also the smoke of a vectorised step on the delta layout: its full cycle runs with the slow tests.)"""
    batches = [[(1, 1, 5), (2, 2, 6)], [(3, 1, 1)]]
    first, _ = run(spark, tmp_path, batches[:1], layout="delta")
    assert first == sorted(model(batches[:1]))
    with pytest.raises(RestartError, match=r"'totals'.*a log of changed rows.*one value per state bucket"):
        run(spark, tmp_path, batches, layout="blob")


def test_a_step_the_layout_cannot_keep_is_refused_before_the_job_starts(spark, tmp_path):
    with pytest.raises(PipelineError, match=r"totals.*state_layout='delta'.*one integer field \(got string\)"):
        run(spark, tmp_path, [[(1, "a", 1)]], key_type="string")


@pytest.mark.slow
def test_large_state_example(spark, load_example, tmp_path):
    example = load_example("large_state")
    results = [example.run_layout(layout, str(tmp_path / layout), 6000, 1500, 12, spark) for layout in ("blob", "delta")]
    assert all(r["exact"] for r in results)
    blob, delta = results
    assert delta["rebuilt_rows"] > 0  # the second run started without local copies
    assert delta["checkpoint_bytes_per_batch"] < blob["checkpoint_bytes_per_batch"]
    assert example.run_moved(str(tmp_path / "moved"), 6000, 1500, 12, spark)["exact"]
