"""Savepoints: stop-with-savepoint, restore (changed pipelines, rescaling), the
State Processor API (read, write) and damaged savepoints — each against the
output of the same pipeline run without interruption."""

import json
import os
import threading
import time
from collections import Counter

import pandas as pd
import pytest

from ember import CollectSink, ScriptedSource, StreamEnvironment
from ember.cli.main import main
from ember.functions import KeyedProcessFunction
from ember.runner.spark.restart import RestartError
from ember.savepoints import Savepoint, SavepointError, create_savepoint, list_savepoints, restore_savepoint
from ember.state import ValueStateDescriptor

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v bigint"
KEYS = ["a", "b", "c", "d", "e"]
# 8 micro-batches of 8 records each; key and value vary so every count and sum is distinct.
BATCHES = [[(b * 10 + i, KEYS[(b + i * i) % 5], b * 7 + i) for i in range(8)] for b in range(8)]
OUT = "k string, n bigint, total bigint, ts bigint"


class RunningTotal(KeyedProcessFunction):
    """Per key: how many records and their sum so far, emitted with every record."""

    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    def process_element(self, value, ctx):
        n, total = self.n.value() + 1, self.total.value() + value["v"]
        self.n.update(n)
        self.total.update(total)
        yield {"k": value["k"], "n": n, "total": total, "ts": value["ts"]}


class RunningTotalWithMax(RunningTotal):
    """A compatible new version: one more state (starts empty), one more field."""

    def open(self, ctx):
        super().open(ctx)
        self.biggest = ctx.get_state(ValueStateDescriptor("biggest", default=None))

    def process_element(self, value, ctx):
        biggest = self.biggest.value()
        self.biggest.update(value["v"] if biggest is None else max(biggest, value["v"]))
        yield from super().process_element(value, ctx)


def _job(spark, root, batches, *, fn=None, key="k", parallelism=2, trigger_ms=0, doubled=False):
    env = StreamEnvironment(
        master="local[2]", checkpoint_dir=root, parallelism=parallelism, trigger_interval=trigger_ms, spark=spark
    )
    stream = env.from_source(ScriptedSource(batches, SCHEMA), None, name="events")
    if doubled:  # a new stateless step: compatible
        stream = stream.select("ts", "k", "v * 2 AS v", name="doubled")
    out = stream.key_by(key).process(fn or RunningTotal(), OUT, name="totals")
    sink = CollectSink()
    out.sink_to(sink)
    return env, sink


def _rows(sink):
    return [(r["k"], r["n"], r["total"], r["ts"]) for r in sink.rows()]


def _run(spark, root, name, batches, **kw):
    from_savepoint = kw.pop("from_savepoint", None)
    env, sink = _job(spark, root, batches, **kw)
    env.execute(name, progress=False, from_savepoint=from_savepoint)
    return _rows(sink)


@pytest.fixture(scope="module")
def uninterrupted(spark, tmp_path_factory):
    return _run(spark, tmp_path_factory.mktemp("whole"), "whole", BATCHES)


def test_stop_with_savepoint_then_restore_equals_an_uninterrupted_run(spark, tmp_path, uninterrupted):
    root = tmp_path / "ckpt"
    env, sink = _job(spark, root, BATCHES, trigger_ms=250)
    point = _stop_with_savepoint(env, "orders", root, str(tmp_path / "sp"), 3)
    first = _rows(sink)
    assert 0 < len(first) < len(uninterrupted), "the job must stop mid-way for this test to mean anything"
    assert point.manifest["stopped"] is True and point.batch_id >= 2
    assert not os.path.exists(root / "orders" / "ember" / "running")
    taken = json.loads((root / "orders" / "ember" / "savepoints-taken.json").read_text())  # the dashboard lists it
    assert [(t["batch_id"], t["path"], t["stopped"]) for t in taken] == [(point.batch_id, os.path.abspath(point.path), True)]
    rest = _run(spark, root, "orders-v2", BATCHES, from_savepoint=point.path)
    assert not (root / "orders-v2" / "ember" / "savepoints-taken.json").exists()  # the original's, not the new job's
    # Nothing lost, nothing twice: together exactly the uninterrupted output.
    assert Counter(first + rest) == Counter(uninterrupted)
    assert len(first) + len(rest) == len(uninterrupted)


def test_restore_into_compatible_changed_pipelines_side_by_side(spark, tmp_path, uninterrupted):
    root = tmp_path / "ckpt"
    head = _run(spark, root, "v1", BATCHES[:3])
    point = create_savepoint(str(root / "v1"), root=str(tmp_path / "sp"))
    assert list_savepoints(str(tmp_path / "sp"))[0].path == point.path
    # What-if: two versions of the pipeline from the same savepoint.
    same = _run(spark, root, "v1-again", BATCHES, from_savepoint=point.path)
    with pytest.raises(SavepointError, match="already has progress.*to continue a job restored earlier, run it without"):
        _run(spark, root, "v1-again", BATCHES, from_savepoint=point.path)
    changed = _run(spark, root, "v2", BATCHES, from_savepoint=point.path, fn=RunningTotalWithMax(), doubled=True)
    assert Counter(head + same) == Counter(uninterrupted)
    assert len(changed) == len(same)
    # v2 doubles the values of the records after the cut: totals continue from the saved state.
    saved = {}
    for k, n, total, _ in head:
        saved[k] = max(saved.get(k, (0, 0)), (n, total))
    for (k, n, total, ts), (k2, n2, total2, ts2) in zip(sorted(same, key=lambda r: r[3]), sorted(changed, key=lambda r: r[3])):
        assert (k, n, ts) == (k2, n2, ts2)
        base = saved.get(k, (0, 0))[1]
        assert total2 - base == 2 * (total - base)


def test_incompatible_change_is_refused_before_anything_is_restored(spark, tmp_path):
    root = tmp_path / "ckpt"
    _run(spark, root, "v1", BATCHES[:2])
    point = create_savepoint(str(root / "v1"), root=str(tmp_path / "sp"))
    changed = r"cannot start from the savepoint .*\n  - stateful operator 'totals': key changed from \['k'\] to \['ts'\]"
    with pytest.raises(RestartError, match=changed):
        _run(spark, root, "v2", BATCHES, from_savepoint=point.path, key="ts")
    assert not (root / "v2" / "offsets").exists()
    env, _ = _job(spark, root, BATCHES)  # more state partitions than the job's 128 state buckets: none would hold state
    with pytest.raises(SavepointError, match="rescaling to parallelism 129: .* at most 128 state partitions"):
        restore_savepoint(spark, point.path, str(root / "v3"), env.graph(), parallelism=129)
    with pytest.raises(RestartError, match="spread over 128 state buckets in the checkpoint, and this pipeline has max_parallelism=64"):
        restore_savepoint(spark, point.path, str(root / "v3"), env.graph(), parallelism=4, max_parallelism=64)
    assert not (root / "v3").exists()


@pytest.mark.slow  # rescaling is covered in make test by the three-step and native-window tests below
def test_rescale_2_4_1_keeps_results_identical(spark, tmp_path, uninterrupted):
    root, sp = tmp_path / "ckpt", str(tmp_path / "sp")
    out = _run(spark, root, "p2", BATCHES[:3], parallelism=2)
    first = create_savepoint(str(root / "p2"), root=sp)
    assert first.partitions == 2
    out += _run(spark, root, "p4", BATCHES[:5], parallelism=4, from_savepoint=first.path)
    second = create_savepoint(str(root / "p4"), root=sp)
    assert second.partitions == 4
    out += _run(spark, root, "p1", BATCHES, parallelism=1, from_savepoint=second.path)
    assert Savepoint(create_savepoint(str(root / "p1"), root=sp).path).partitions == 1
    assert Counter(out) == Counter(uninterrupted)


def test_state_read_matches_the_job_and_written_state_changes_the_output_exactly(spark, tmp_path, uninterrupted):
    root = tmp_path / "ckpt"
    head = _run(spark, root, "v1", BATCHES[:4])
    point = create_savepoint(str(root / "v1"), root=str(tmp_path / "sp"))
    state = point.read_state("totals", spark)
    last = {}
    for k, n, total, ts in head:
        if ts >= last.get(k, (0, 0, -1))[2]:
            last[k] = (n, total, ts)
    expected = sorted([(k, "n", n) for k, (n, _, _) in last.items()] + [(k, "total", t) for k, (_, t, _) in last.items()])
    assert sorted(state.itertuples(index=False, name=None)) == expected

    # Fix a bad counter: key 'a' restarts from n = 1000, total = 0; key 'z' is bootstrapped.
    fixed = state[state.k != "a"]
    fixed = pd.concat([fixed, pd.DataFrame({"k": ["a", "a", "z"], "state": ["n", "total", "n"], "value": [1000, 0, 7]})])
    written = point.write_state("totals", fixed, str(tmp_path / "sp" / "fixed"), spark)
    assert written.batch_id == point.batch_id + 1 and written.manifest["derived_from"]["operator"] == "totals"
    assert sorted(written.read_state("totals", spark).itertuples(index=False, name=None)) == sorted(
        fixed.itertuples(index=False, name=None)
    )
    plain = _run(spark, root, "plain", BATCHES, from_savepoint=point.path)
    after = _run(spark, root, "after", BATCHES, from_savepoint=written.path)
    assert len(plain) == len(after)
    base_n, base_total = last["a"][0], last["a"][1]
    for (k, n, total, ts), (k2, n2, total2, ts2) in zip(sorted(plain, key=lambda r: r[3]), sorted(after, key=lambda r: r[3])):
        assert (k, ts) == (k2, ts2)
        if k == "a":
            assert (n2, total2) == (n - base_n + 1000, total - base_total)
        else:
            assert (n2, total2) == (n, total)  # every other key exactly as without the change


def test_damaged_savepoints_are_refused_and_never_half_loaded(spark, tmp_path):
    root = tmp_path / "ckpt"
    _run(spark, root, "v1", BATCHES[:4])
    point = create_savepoint(str(root / "v1"), root=str(tmp_path / "sp"))
    state_files = sorted(rel for rel in point.manifest["files"] if rel.startswith("state/0/") and "_metadata" not in rel)
    victim = os.path.join(point.path, state_files[-1])

    data = open(victim, "rb").read()
    with open(victim, "wb") as f:  # truncated
        f.write(data[: len(data) // 2])
    with pytest.raises(SavepointError, match=r"damaged and was not used:\n  - state/0/.* bytes, the manifest says .* \(truncated or changed\)"):
        _run(spark, root, "v2", BATCHES, from_savepoint=point.path)
    assert not (root / "v2").exists() or not (root / "v2" / "state").exists()

    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    with open(victim, "wb") as f:  # same size, one byte changed
        f.write(bytes(flipped))
    with pytest.raises(SavepointError, match="does not match its checksum"):
        Savepoint(point.path)
    os.remove(os.path.join(point.path, "_savepoint.json"))
    with pytest.raises(SavepointError, match="is not a savepoint"):
        _run(spark, root, "v3", BATCHES, from_savepoint=point.path)
    assert not (root / "v3" / "offsets").exists()


def test_savepoint_cli_create_list_inspect_delete(spark, tmp_path, capsys):
    root = tmp_path / "ckpt"
    _run(spark, root, "cli", BATCHES[:3])
    sp = str(tmp_path / "sp")
    assert main(["savepoint", "create", "cli", "--checkpoint-dir", str(root), "--dir", sp]) == 0
    path = capsys.readouterr().out.strip()
    assert main(["savepoint", "list", "--dir", sp]) == 0
    assert path in capsys.readouterr().out
    assert main(["savepoint", "inspect", path, "--state", "totals"]) == 0
    shown = capsys.readouterr().out
    assert "operator 0 'totals': process function, key (k), state layout 'blob' on " in shown
    assert "5 key(s), 10 state row(s)" in shown
    assert main(["savepoint", "delete", str(root / "cli")]) == 2  # a checkpoint, not a savepoint: refused
    assert "is not a savepoint" in capsys.readouterr().err
    assert main(["savepoint", "delete", path]) == 0
    assert not os.path.exists(path)


# In `make test-all`: writing state and rescaling are each in the default run (state read/write,
# the three-step rescale); this runs the worked example end to end (~35 s).
@pytest.mark.slow
def test_bugfix_example_repairs_state_and_rescales(spark, tmp_path, load_example):
    example = load_example("savepoint_bugfix")
    out = example.run(spark, str(tmp_path / "work"))
    assert out["before"] > 0 and out["after"] > 0 and out["ids_exact"]
    assert out["final"] == out["expected"]
    assert out["partitions"] == (2, 2)




def _vector_fn():
    import numpy as np

    from ember.functions import VectorizedKeyedFunction

    class Totals(VectorizedKeyedFunction):
        state_schema = "n bigint, total bigint"

        def process_batch(self, events, state, ctx):
            out = []
            updates = {}
            for k, group in events.groupby("k", sort=True):
                n0, t0 = (int(state.loc[k, "n"]), int(state.loc[k, "total"])) if k in state.index else (0, 0)
                ns = n0 + np.arange(1, len(group) + 1)
                ts = t0 + group["v"].cumsum().to_numpy()
                out.append(pd.DataFrame({"k": k, "n": ns, "total": ts, "ts": group["ts"].to_numpy()}))
                updates[k] = (int(ns[-1]), int(ts[-1]))
            upd = pd.DataFrame.from_dict(updates, orient="index", columns=["n", "total"])
            return pd.concat(out), upd

    return Totals()


@pytest.mark.parametrize("shape", ["alone", "chained"])
def test_vectorised_state_read_and_write(spark, tmp_path, shape):
    """A vectorised step's state read, changed for one key, written and restored: the output
    goes on from the written state for that key, exactly as without the change for the others.
    ``chained``: the step follows another keyed step, so both run on transformWithStateInPandas."""
    root = tmp_path / "ckpt"

    def run(name, batches, sp=None):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2, spark=spark)
        sink = CollectSink()
        events = env.from_source(ScriptedSource(batches, SCHEMA), None, name="events")
        if shape == "chained":
            events = events.key_by("k").process(Doubled(), SCHEMA, name="doubled")
        events.key_by("k").process_batches(_vector_fn(), OUT, name="vtotals").sink_to(sink)
        env.execute(name, progress=False, from_savepoint=sp)
        return _rows(sink)

    head = run("v1", BATCHES[:3])
    point = create_savepoint(str(root / "v1"), root=str(tmp_path / "sp"))
    assert [op["name"] for op in point.operators] == (["vtotals"] if shape == "alone" else ["doubled", "vtotals"])
    state = point.read_state("vtotals", spark)
    last = {}
    for k, n, total, _ in head:
        last[k] = max(last.get(k, (0, 0)), (n, total))
    assert sorted(state.itertuples(index=False, name=None)) == sorted((k, n, t) for k, (n, t) in last.items())
    state.loc[state.k == "b", ["n", "total"]] = [500, 5]
    written = point.write_state("vtotals", state, str(tmp_path / "sp" / "w"), spark)
    if shape == "chained":
        assert written.read_state("doubled", spark).equals(point.read_state("doubled", spark))
    plain, after = run("plain", BATCHES, point.path), run("after", BATCHES, written.path)
    for (k, n, total, ts), (k2, n2, total2, ts2) in zip(sorted(plain, key=lambda r: r[3]), sorted(after, key=lambda r: r[3])):
        assert (k, ts) == (k2, ts2)
        if k == "b":
            assert (n2, total2) == (n - last["b"][0] + 500, total - last["b"][1] + 5)
        else:
            assert (n2, total2) == (n, total)


def _stop_with_savepoint(env, name, root, sp_root, commits_wanted):
    """Run ``env``'s job in a thread; once it committed ``commits_wanted`` batches, stop it with a savepoint."""
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("r", env.execute(name, progress=False)))
    runner.start()
    commits = root / name / "commits"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len([f for f in os.listdir(commits) if f.isdigit()] if commits.exists() else []) < commits_wanted:
        time.sleep(0.05)
    point = create_savepoint(str(root / name), root=sp_root, stop=True, timeout_s=120)
    runner.join(60)
    assert not runner.is_alive() and result["r"].stopped_because == "stopped for a savepoint"
    return point


def test_native_window_state_is_readable_and_rescales(spark, tmp_path):
    from ember import TumblingEventTimeWindows, WatermarkStrategy

    root = tmp_path / "ckpt"

    def job(parallelism, trigger_ms=0):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=parallelism, trigger_interval=trigger_ms, spark=spark)
        sink = CollectSink()
        (env.from_source(ScriptedSource(BATCHES, SCHEMA), WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
         .key_by("k").window(TumblingEventTimeWindows.of(10)).sum("v", name="sums").sink_to(sink))
        return env, sink

    def rows(sink):
        return sorted((r["k"], r["window_start"], r["sum_v"]) for r in sink.rows())

    env, sink = job(2)
    env.execute("whole", progress=False)
    whole = rows(sink)
    env, sink = job(2, trigger_ms=250)
    point = _stop_with_savepoint(env, "p2", root, str(tmp_path / "sp"), 4)
    head = rows(sink)
    assert point.operators[0]["kind"] == "window aggregate"
    state = point.read_state("sums", spark)
    assert len(state) > 0 and "k" in state.columns  # the open windows, as Spark keeps them
    env, sink = job(3)
    env.execute("p3", progress=False, from_savepoint=point.path)
    assert create_savepoint(str(root / "p3"), root=str(tmp_path / "sp")).partitions == 3
    assert 0 < len(head) < len(whole)
    assert sorted(head + rows(sink)) == whole


@pytest.mark.slow  # ~60 s; by default: stop-with-savepoint and restore (one step), chained steps' state read back
def test_three_stateful_steps_stop_with_savepoint_rescale_2_to_4_equals_an_uninterrupted_run(spark, tmp_path):
    """Issue 17: a chain of three keyed steps (running totals -> 20 ms windows of them ->
    running totals of the windows) on transformWithStateInPandas, stopped with a savepoint
    mid-way, restored with 4 state partitions instead of 2: its output then equals the
    uninterrupted run's, nothing lost or twice."""
    from ember import TumblingEventTimeWindows, WatermarkStrategy

    root = tmp_path / "ckpt"

    def job(parallelism, trigger_ms=0):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=parallelism, trigger_interval=trigger_ms,
                                spark=spark)
        sink = CollectSink()
        (env.from_source(ScriptedSource(BATCHES, SCHEMA), WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
         .key_by("k").process(RunningTotal(), OUT, name="totals")
         .key_by("k").window(TumblingEventTimeWindows.of(20)).max("total", name="peaks")
         .key_by("k").sum("max_total", name="sum-of-peaks").sink_to(sink))
        return env, sink

    def rows(sink):
        return sorted((r["k"], r["window_start"], r["max_total"]) for r in sink.rows())

    env, sink = job(2)
    env.execute("whole", progress=False)
    whole = rows(sink)
    env, sink = job(2, trigger_ms=250)
    point = _stop_with_savepoint(env, "three", root, str(tmp_path / "sp"), 4)
    head = rows(sink)
    assert [op["name"] for op in point.operators] == ["totals", "peaks", "sum-of-peaks"]
    env, sink = job(4)
    env.execute("three-p4", progress=False, from_savepoint=point.path)
    assert create_savepoint(str(root / "three-p4"), root=str(tmp_path / "sp")).partitions == 4
    assert 0 < len(head) < len(whole)
    assert Counter(head + rows(sink)) == Counter(whole)


class Forward(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


class Doubled(KeyedProcessFunction):
    """Passes each record on with its value doubled (a keyed step read by a fan-out)."""

    def process_element(self, value, ctx):
        yield {**value, "v": value["v"] * 2}


def test_a_fan_out_stops_with_a_savepoint_rescales_2_to_4_and_its_lanes_state_reads_back(spark, tmp_path):
    """Issue 17: a keyed step read by two keyed steps (lanes of one Spark operator, one of
    them read by a further keyed step: a second level) and a sink, stopped with a savepoint
    mid-way and restored with 4 state partitions: the three outputs equal the uninterrupted
    run's, and each lane's state reads as its own."""
    root = tmp_path / "ckpt"

    def job(parallelism, trigger_ms=0):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=parallelism, trigger_interval=trigger_ms,
                                spark=spark)
        by_k, by_ts, raw = CollectSink(), CollectSink(), CollectSink()
        doubled = env.from_source(ScriptedSource(BATCHES, SCHEMA), None, name="events").key_by("k").process(
            Doubled(), SCHEMA, name="doubled")
        (doubled.key_by("k").process(RunningTotal(), OUT, name="by-k")
         .key_by("n").process(Forward(), OUT, name="by-n").sink_to(by_k, name="by-k-out"))  # a second level
        doubled.filter("v % 3 <> 0").key_by("ts").process(RunningTotal(), OUT, name="by-ts").sink_to(by_ts, name="by-ts-out")
        doubled.sink_to(raw, name="raw")
        return env, (by_k, by_ts, raw)

    def rows(sinks):
        return [sorted(tuple(sorted(r.items())) for r in sink.rows()) for sink in sinks]

    env, sinks = job(2)
    env.execute("whole", progress=False)
    whole = rows(sinks)
    env, sinks = job(2, trigger_ms=250)
    point = _stop_with_savepoint(env, "fan", root, str(tmp_path / "sp"), 4)
    head = rows(sinks)
    assert [(op["name"], op.get("lane"), op.get("level")) for op in point.operators] == [
        ("doubled", None, None), ("by-k", 0, None), ("by-n", 0, 1), ("by-ts", 1, None)]
    state = point.read_state("by-k", spark)
    n_by_key = state[state["state"] == "n"].set_index("k")["value"].to_dict()
    assert n_by_key == Counter(dict(r)["k"] for r in head[0])  # one output per record the lane counted
    ts_state = point.read_state("by-ts", spark)
    assert set(ts_state["ts"]) == {dict(r)["ts"] for r in head[1]}
    env, sinks = job(4)
    env.execute("fan-p4", progress=False, from_savepoint=point.path)
    assert create_savepoint(str(root / "fan-p4"), root=str(tmp_path / "sp")).partitions == 4
    tail = rows(sinks)
    assert 0 < len(head[2]) < len(whole[2])
    for before, after, uninterrupted in zip(head, tail, whole):
        assert Counter(before + after) == Counter(uninterrupted)


@pytest.mark.parametrize("shape", ["chain", pytest.param("lane", marks=pytest.mark.slow)])
def test_written_state_of_a_step_on_transform_with_state_changes_the_output_exactly(spark, tmp_path, shape):
    """Issue 17: the state of a keyed step of a job with several (on transformWithStateInPandas:
    a chain's second step, or the second lane of a fan-out) written in a savepoint; restored,
    the job goes on from it — key 'a' from the written counter, every other key (and the other
    lane) exactly as without the change."""
    root = tmp_path / "ckpt"

    def job(name, batches, from_savepoint=None):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2, spark=spark)
        sink, other = CollectSink(), CollectSink()
        first = env.from_source(ScriptedSource(batches, SCHEMA), None, name="events").key_by("k").process(
            Doubled(), SCHEMA, name="doubled")
        if shape == "lane":
            first.key_by("k").process(RunningTotal(), OUT, name="other").sink_to(other, name="other-out")
        first.key_by("k").process(RunningTotal(), OUT, name="totals").sink_to(sink, name="totals-out")
        env.execute(name, progress=False, from_savepoint=from_savepoint)
        return _rows(sink), _rows(other)

    job("v1", BATCHES[:4])
    point = create_savepoint(str(root / "v1"), root=str(tmp_path / "sp"))
    if shape == "lane":
        assert [(op["name"], op.get("lane")) for op in point.operators] == [("doubled", None), ("other", 0), ("totals", 1)]
    state = point.read_state("totals", spark)
    fixed = state[state.k != "a"]
    fixed = pd.concat([fixed, pd.DataFrame({"k": ["a", "a", "z"], "state": ["n", "total", "n"], "value": [1000, 0, 7]})])
    written = point.write_state("totals", fixed, str(tmp_path / "sp" / "fixed"), spark)
    assert sorted(written.read_state("totals", spark).itertuples(index=False, name=None)) == sorted(
        fixed.itertuples(index=False, name=None))
    assert written.read_state("doubled", spark).equals(point.read_state("doubled", spark))
    if shape == "lane":  # the other lane's buckets are the same operator's: untouched
        assert written.read_state("other", spark).equals(point.read_state("other", spark))
    (plain, plain_other), (after, after_other) = (job("plain", BATCHES, point.path), job("after", BATCHES, written.path))
    assert len(plain) == len(after) > 0 and plain_other == after_other
    base = {k: (n, total) for k, n, total, ts in sorted(_rows_of(state))}
    for (k, n, total, ts), (k2, n2, total2, ts2) in zip(sorted(plain, key=lambda r: r[3]), sorted(after, key=lambda r: r[3])):
        assert (k, ts) == (k2, ts2)
        if k == "a":
            assert (n2, total2) == (n - base["a"][0] + 1000, total - base["a"][1])
        else:
            assert (n2, total2) == (n, total)


def _rows_of(state):
    """(key, n, total, 0) per key of a RunningTotal step's state read back."""
    values = {(k, s): v for k, s, v in state.itertuples(index=False, name=None)}
    return [(k, values[(k, "n")], values[(k, "total")], 0) for k in sorted({k for k, _ in values})]


def test_written_state_of_a_step_without_group_timeout_restores(spark, tmp_path):
    """An event-time step on a stream that does not end runs without Spark's group timeout
    (translators/keyed.py), so its state rows have no timeout column: a savepoint's written
    state has its shape, and the restored job goes on from it — key 'a' from the written
    counter, every other key exactly as without the change."""
    from datetime import timedelta

    from ember import WatermarkStrategy
    from ember.runner.spark.state_io import _keeps_timeout

    root = tmp_path / "ckpt"
    total = sum(len(b) for b in BATCHES)

    def run(name, max_events, from_savepoint=None):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2, spark=spark)
        sink = CollectSink()
        (env.from_source(ScriptedSource(BATCHES, SCHEMA, ends=False),
                         WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=5), "ts"), name="events")
         .key_by("k").process(RunningTotal(), OUT, name="totals").sink_to(sink))
        env.execute(name, progress=False, max_events=max_events, from_savepoint=from_savepoint)
        return _rows(sink)

    head = run("v1", 4 * 8)
    point = create_savepoint(str(root / "v1"), root=str(tmp_path / "sp"))
    assert not _keeps_timeout(spark, point.path, point.batch_id, 0)
    state = point.read_state("totals", spark)
    fixed = pd.concat([state[state.k != "a"], pd.DataFrame({"k": ["a", "a"], "state": ["n", "total"], "value": [1000, 0]})])
    written = point.write_state("totals", fixed, str(tmp_path / "sp" / "fixed"), spark)
    plain = run("plain", total - len(head), from_savepoint=point.path)
    after = run("after", total - len(head), from_savepoint=written.path)
    assert len(plain) == len(after) == total - len(head)
    base = {k: (n, t) for k, n, t, _ in sorted(head, key=lambda r: r[3])}
    for (k, n, t, ts), (k2, n2, t2, ts2) in zip(sorted(plain, key=lambda r: r[3]), sorted(after, key=lambda r: r[3])):
        assert (k, ts) == (k2, ts2)
        assert (n2, t2) == ((n - base["a"][0] + 1000, t - base["a"][1]) if k == "a" else (n, t))
