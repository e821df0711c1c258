"""Restarting a checkpoint with an incompatible pipeline fails before any batch runs,
naming the operator and the reason; a compatible change (a new stateless step) continues."""

import json
import os

import pytest
from pyspark.sql import functions as F

from ember import CollectSink, ScriptedSource, StreamEnvironment
from ember.errors import ConfigError, SavepointError
from ember.functions import KeyedProcessFunction
from ember.runner.spark.checkpoint import CheckpointLayout
from ember.runner.spark.restart import RestartError, compare
from ember.savepoints import create_savepoint, restore_savepoint
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


def _run(spark, ckpt, batches, *, key="k", fn=None, extra_map=False, stateful=True, max_parallelism=None, from_savepoint=None):
    env = StreamEnvironment(master="local[2]", checkpoint_dir=ckpt, parallelism=2, spark=spark, max_parallelism=max_parallelism)
    stream = env.from_source(ScriptedSource(batches, SCHEMA), None, name="events")
    if extra_map:  # a new stateless step: compatible
        stream = stream.filter("ts > 0", name="positive")
    if stateful:
        out = stream.key_by(key).process(fn or RunningCount(), OUT, name="counts")
    else:
        out = stream.select("k", "1 AS n", "ts", name="ones")
    sink = CollectSink()
    out.sink_to(sink)
    env.execute("compat", progress=False, from_savepoint=from_savepoint)
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


def test_a_job_keeps_the_state_buckets_of_its_first_run(spark, tmp_path):
    """``max_parallelism`` spreads the keys over that many state buckets (the grouping keys of
    Spark's state) and is fixed by the first run: a restart given another value is refused before
    anything runs; left unset, it is the checkpoint's and the counts carry on."""
    assert _run(spark, tmp_path, BATCHES[:2], max_parallelism=3) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1)]
    ckpt = os.path.join(tmp_path, "compat")
    state = spark.read.format("statestore").option("batchId", 1).option("operatorId", 0).load(ckpt)
    keys = spark.createDataFrame([("a",), ("b",), ("c",)], "k string")
    expected = {r[0] for r in keys.select(F.pmod(F.xxhash64("k"), F.lit(3))).collect()}
    assert {r[0] for r in state.select("key.*").collect()} == expected  # Spark's state grouped by bucket, of 3
    commits = sorted(os.listdir(os.path.join(ckpt, "commits")))
    with pytest.raises(RestartError, match=r"'counts': its keys are spread over 3 state buckets in the checkpoint, and "
                                           r"this pipeline has max_parallelism=128; .*give max_parallelism=3"):
        _run(spark, tmp_path, BATCHES, max_parallelism=128)
    assert sorted(os.listdir(os.path.join(ckpt, "commits"))) == commits  # nothing ran
    assert _run(spark, tmp_path, BATCHES) == [("a", 4), ("b", 2)]
    assert json.load(open(CheckpointLayout(ckpt).pipeline))["operators"][0]["state buckets"] == 3


def test_a_restored_savepoint_keeps_its_state_buckets(spark, tmp_path):
    """Left unset, ``max_parallelism`` is the savepoint's: a rescale past it is refused before
    anything is copied, and a restore continues the counts over its 3 buckets."""
    _run(spark, tmp_path / "a", BATCHES[:2], max_parallelism=3)
    point = create_savepoint(str(tmp_path / "a" / "compat"), root=str(tmp_path / "sp"))
    env = StreamEnvironment(master="local[2]", parallelism=4, spark=spark)
    env.from_source(ScriptedSource(BATCHES, SCHEMA), None, name="events").key_by("k").process(
        RunningCount(), OUT, name="counts").sink_to(CollectSink())
    with pytest.raises(SavepointError, match="rescaling to parallelism 4: the job's keys are spread over 3 state buckets"):
        restore_savepoint(spark, point.path, str(tmp_path / "b"), env.graph(), parallelism=4)
    assert not (tmp_path / "b").exists()
    assert _run(spark, tmp_path / "b", BATCHES, from_savepoint=point.path) == [("a", 4), ("b", 2)]


def test_a_new_jobs_max_parallelism_follows_its_parallelism():
    """Flink's default: 128, or 1.5x the parallelism rounded up to a power of two, at most 32,768."""
    for parallelism, expected in ((None, 128), (2, 128), (85, 128), (86, 256), (171, 256), (256, 512), (30_000, 32_768)):
        config = StreamEnvironment(master="local[2]", parallelism=parallelism).config
        assert (config.max_parallelism, config.max_parallelism_given) == (expected, False)
    assert StreamEnvironment(master="local[2]", parallelism=2, max_parallelism=128).config.max_parallelism_given
    with pytest.raises(ConfigError, match="parallelism 40000 is above max_parallelism 32768"):
        StreamEnvironment(master="local[2]", parallelism=40_000)


def test_max_parallelism_bounds_the_state_partitions(spark, tmp_path):
    with pytest.raises(ConfigError, match="parallelism 4 is above max_parallelism 2"):
        StreamEnvironment(master="local[2]", parallelism=4, max_parallelism=2)
    for wrong in (0, 40_000, 2.5, True):
        with pytest.raises(ConfigError, match="max_parallelism must be an int from 1 to 32,768"):
            StreamEnvironment(master="local[2]", max_parallelism=wrong)
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, spark=spark, max_parallelism=1)  # 2 cores: 2 partitions
    env.from_source(ScriptedSource(BATCHES, SCHEMA), None).key_by("k").process(RunningCount(), OUT).sink_to(CollectSink())
    with pytest.raises(ConfigError, match=r"2 state partitions \(parallelism\) over max_parallelism=1 state buckets"):
        env.execute("compat", progress=False)
    assert not os.path.exists(os.path.join(tmp_path, "compat", "commits"))  # refused before the job started


def test_compare_reads_a_manifest_without_state_buckets_as_128():
    op = {"name": "counts", "kind": "process function", "keys": ["k"], "state": {}, "spark operator": "applyInPandasWithState"}
    base = {"sources": [], "bounded": True, "operators": [op]}
    assert compare(base, {**base, "operators": [{**op, "state buckets": 128}]}) == []
    assert "spread over 128 state buckets in the checkpoint, and this pipeline has max_parallelism=16" in \
        compare(base, {**base, "operators": [{**op, "state buckets": 16}]})[0]
