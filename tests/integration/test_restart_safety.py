"""Restarting a checkpoint with an incompatible pipeline fails before any batch runs,
naming the operator and the reason; a compatible change (a new stateless step) continues."""

import json
import os

import pytest

from ember import CollectSink, ScriptedSource, StreamEnvironment
from ember.functions import KeyedProcessFunction
from ember.runner.spark.checkpoint import CheckpointLayout
from ember.runner.spark.restart import RestartError, compare
from ember.state import ListStateDescriptor, ValueStateDescriptor

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, g string"
BATCHES = [[(1, "a", "x"), (2, "b", "x"), (3, "a", "y")], [(5, "a", "x"), (4, "c", "y")], [(6, "b", "x"), (7, "a", "y")]]
OUT = "k string, n bigint, ts bigint"


class RunningCount(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        yield {"k": value["k"], "n": n, "ts": value["ts"]}


class ListCount(RunningCount):
    def open(self, ctx):
        self.count = ctx.get_state(ListStateDescriptor("count"))


def _run(spark, ckpt, batches, *, key="k", fn=None, extra_map=False, stateful=True):
    env = StreamEnvironment(master="local[2]", checkpoint_dir=ckpt, parallelism=2, spark=spark)
    stream = env.from_source(ScriptedSource(batches, SCHEMA), None, name="events")
    if extra_map:  # a new stateless step: compatible
        stream = stream.filter("ts > 0", name="positive")
    if stateful:
        out = stream.key_by(key).process(fn or RunningCount(), OUT, name="counts")
    else:
        out = stream.select("k", "1 AS n", "ts", name="ones")
    sink = CollectSink()
    out.sink_to(sink)
    env.execute("compat", progress=False)
    return sorted((r["k"], r["n"]) for r in sink.rows())


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(key="g"), r"stateful operator 'counts': key changed from \['k'\] to \['g'\]"),
        (dict(fn=ListCount()), r"'counts': state descriptors changed from "
                               r"\{\"count\": \"ValueStateDescriptor\"\} to \{\"count\": \"ListStateDescriptor\"\}"),
    ],
)
def test_incompatible_restart_fails_before_processing(spark, tmp_path, change, message):
    assert _run(spark, tmp_path, BATCHES[:2]) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1)]
    commits = sorted(os.listdir(os.path.join(tmp_path, "compat", "commits")))
    with pytest.raises(RestartError, match=message):
        _run(spark, tmp_path, BATCHES, **change)
    assert sorted(os.listdir(os.path.join(tmp_path, "compat", "commits"))) == commits  # nothing ran


def test_removed_or_added_stateful_operator_is_refused(spark, tmp_path):
    _run(spark, tmp_path / "removed", BATCHES[:1])
    with pytest.raises(RestartError, match=r"'counts' \(process function\) holds state in the checkpoint but was removed"):
        _run(spark, tmp_path / "removed", BATCHES, stateful=False)
    _run(spark, tmp_path / "added", BATCHES[:1], stateful=False)
    with pytest.raises(RestartError, match=r"stateful operator 'counts' \(process function\) is new"):
        _run(spark, tmp_path / "added", BATCHES)


def test_a_new_stateless_step_is_accepted_and_state_carries_on(spark, tmp_path):
    _run(spark, tmp_path, BATCHES[:2])
    # Only the third batch is new; its counts continue from the checkpoint's state.
    assert _run(spark, tmp_path, BATCHES, extra_map=True) == [("a", 4), ("b", 2)]
    with open(CheckpointLayout(os.path.join(tmp_path, "compat")).pipeline) as f:
        assert [op["name"] for op in json.load(f)["operators"]] == ["counts"]


def test_compare_reports_source_changes():
    base = {"sources": [{"name": "events", "kind": "ScriptedSource"}], "bounded": True, "operators": []}
    more = {**base, "sources": base["sources"] + [{"name": "other", "kind": "ScriptedSource"}]}
    assert compare(base, more) == ["the checkpoint has 1 source(s) (events), the pipeline 2 (events, other)"]
    kind = {**base, "sources": [{"name": "events", "kind": "RedisStreamSource"}]}
    assert compare(base, kind) == ["source 'events' is a RedisStreamSource; the checkpoint's was a ScriptedSource ('events')"]
    unbounded = {**base, "bounded": False}
    assert "do not all end" in compare(base, unbounded)[0]
    assert compare(base, base) == []
