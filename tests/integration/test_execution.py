"""Running jobs: stop conditions, restarts, result invariance, sources and sinks."""

import json
import os
from datetime import timedelta

import pytest

from ember import (
    CollectSink,
    ConsoleSink,
    CountSink,
    FileSink,
    FileSource,
    RateSource,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    YahooSource,
)

pytestmark = pytest.mark.spark

WINDOW_MS = 1_000


def _campaign_counts(env, source, name="yahoo", sink=None, **execute):
    import pandas as pd

    sink = sink or CollectSink()
    table = pd.DataFrame(source.campaign_table(), columns=["ad_id", "campaign_id"])
    (
        env.from_source(source, WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=200), "event_time"), name="ads")
        .filter("event_type = 'view'")
        .select("ad_id", "CAST(event_time AS BIGINT) AS event_time")
        .join_lookup(table, on="ad_id")
        .key_by("campaign_id")
        .window(TumblingEventTimeWindows.of(WINDOW_MS))
        .count()
        .sink_to(sink)
    )
    result = env.execute(name, progress=False, **execute)
    return sink, result


def _env(spark, root, **kw):
    return StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2, spark=spark, **kw)


def test_a_timed_run_goes_on_until_min_batches_took_input(spark, tmp_path):
    """A generator at unbounded speed runs on Spark's own reader, which admits input until the
    query stops: the run still ends right after the batch in flight, every event counted once."""
    from ember import GrepSource

    env = _env(spark, tmp_path, max_events_per_batch=1_000)
    sink = CountSink()
    env.from_source(GrepSource(partitions=2), name="lines").sink_to(sink)
    result = env.execute("min-batches", duration_s=0.1, min_batches=6, progress=False)
    assert sum(1 for p in result.progress if p["numInputRows"]) >= 6
    assert result.stopped_because == "duration 0.1 s reached"
    assert sink.count == result.events > 0
    with pytest.raises(Exception, match="min_batches must be an int >= 0"):
        env.execute("bad", duration_s=1, min_batches=-1)


SOURCE = YahooSource(partitions=2, max_events=60_000, nominal_rate=20_000, skew_ms=50, seed=11, start_ms=1_700_000_000_000)


def test_trigger_interval_and_batch_bound_do_not_change_results(spark, tmp_path):
    """The seeds' argument against micro-batching, answered: the event-time
    results are the same whatever the trigger interval or per-batch bound."""
    expected = SOURCE.expected_window_counts(0, 60_000, SOURCE.start_ms, WINDOW_MS)
    outputs = []
    for i, (trigger, per_batch) in enumerate([(0, 4_000), (700, 25_000), (0, 60_000)]):
        env = _env(spark, tmp_path / str(i), trigger_interval=trigger, max_events_per_batch=per_batch)
        sink, result = _campaign_counts(env, SOURCE)
        assert result.events == 60_000
        assert result.batches >= 60_000 // per_batch
        outputs.append(sorted((r["campaign_id"], r["window_start"], r["count"]) for r in sink.rows()))
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0] == sorted((c, w, n) for (c, w), n in expected.items())


def test_restart_resumes_from_the_checkpoint_exactly_once(spark, tmp_path):
    expected = SOURCE.expected_window_counts(0, 60_000, SOURCE.start_ms, WINDOW_MS)
    sink = CollectSink()
    env = _env(spark, tmp_path, max_events_per_batch=10_000)
    _, first = _campaign_counts(env, SOURCE, sink=sink, max_events=20_000)
    assert first.stopped_because == "20,000 events processed" and 20_000 <= first.events < 60_000
    windows_after_first = len(sink.rows())
    second_sink = CollectSink()
    env = _env(spark, tmp_path, max_events_per_batch=10_000)
    _, second = _campaign_counts(env, SOURCE, sink=second_sink)
    assert first.events + second.events == 60_000  # nothing read twice, nothing skipped
    combined = sink.rows() + second_sink.rows()
    assert windows_after_first > 0
    assert sorted((r["campaign_id"], r["window_start"], r["count"]) for r in combined) == sorted(
        (c, w, n) for (c, w), n in expected.items()
    )
    # a third start finds the job complete: no input, no output
    third_sink = CollectSink()
    _, third = _campaign_counts(_env(spark, tmp_path), SOURCE, sink=third_sink)
    assert third.events == 0 and third_sink.rows() == []


def test_file_sink_parquet_and_json_are_readable(spark, env, tmp_path):
    for fmt in ("parquet", "json"):
        out = tmp_path / f"out-{fmt}"
        src = env.from_source(ScriptedSource([[(1, "a")], [(2, "b")]], "id bigint, k string"), name=f"rows-{fmt}")
        src.sink_to(FileSink(str(out), format=fmt))
        env.execute(f"files-{fmt}", progress=False)
        got = sorted(tuple(r) for r in getattr(spark.read, fmt)(str(out)).select("id", "k").collect())
        assert got == [(1, "a"), (2, "b")]


def test_file_source_reads_new_files(env, tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    for i in range(3):
        with open(data / f"part-{i}.json", "w") as f:
            for j in range(4):
                f.write(json.dumps({"id": i * 10 + j, "k": f"k{j}"}) + "\n")
    sink = CollectSink()
    env.from_source(FileSource(str(data), format="json", schema="id bigint, k string", max_files_per_batch=1)).sink_to(sink)
    result = env.execute("file-source", max_events=12, progress=False)
    assert sorted(r["id"] for r in sink.rows()) == sorted(i * 10 + j for i in range(3) for j in range(4))
    assert result.batches == 3  # max_files_per_batch=1: admission control on files


def test_rate_source_and_duration_stop(env):
    sink = CountSink()
    env.from_source(RateSource(rows_per_second=500)).sink_to(sink)
    result = env.execute("rate", duration_s=6, progress=False)
    assert result.stopped_because.startswith("duration")
    assert sink.count == result.events > 0


def test_counting_sink_alone_or_beside_another(env):
    """A job's only counting sink is a no-op write Spark runs itself, its count and sum an
    observed metric of the progress reports; beside another sink it counts from the split.
    Both count every row once and sample latency on the rows whose field is > 0."""
    import time

    past = int(time.time() * 1000) - 5_000
    batches = [[(past, 3), (0, 4)], [(0, 5)], [(past, 6), (past, 7), (0, -1)]]
    sink = CountSink(latency_field="ts", sum_field="v")
    env.from_source(ScriptedSource(batches, "ts bigint, v int"), name="rows").sink_to(sink)
    result = env.execute("count-alone", progress=False)
    assert (sink.count, sink.total) == (6, 24)
    assert [p["observedMetrics"]["ember_count"]["n"] for p in result.progress if p["numInputRows"]] == [2, 1, 3]
    assert len(sink.latencies_ms) == 3 and all(5_000 <= x < 120_000 for x in sink.latencies_ms)
    counted, kept = CountSink(latency_field="ts", sum_field="v"), CollectSink()
    rows = env.from_source(ScriptedSource(batches, "ts bigint, v int"), name="more-rows")
    rows.sink_to(counted)
    rows.filter("v > 4").sink_to(kept)
    result = env.execute("count-beside", progress=False)
    assert (counted.count, counted.total, len(kept.rows())) == (6, 24, 3)
    assert not any("ember_count" in (p.get("observedMetrics") or {}) for p in result.progress)
    assert len(counted.latencies_ms) == 3 and all(5_000 <= x < 120_000 for x in counted.latencies_ms)


def test_the_driver_maps_sparks_classes_from_the_class_archive(spark):
    """``make venv`` built this installation's class archive, and the driver JVM of the session
    Ember started maps it (runner/spark/class_archive.py)."""
    from ember.runner.spark.class_archive import java_options

    options = java_options()
    assert options.startswith("-XX:SharedArchiveFile="), "no class archive: python -m ember.tools.class_archive builds it"
    arguments = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert options.split()[0] in arguments


def test_an_interrupted_write_is_not_logged_as_an_error(spark):
    """A stop interrupts the micro-batch that has just begun when the sources keep admitting
    input; Spark's "write ... is aborting" errors about it are not shown (Ember reports real
    failures itself)."""
    from ember.runner.spark.session import INTERRUPTED_WRITE_LOGGERS

    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    levels = {name: log4j.LogManager.getLogger(name).getLevel().toString() for name in INTERRUPTED_WRITE_LOGGERS}
    assert levels == dict.fromkeys(INTERRUPTED_WRITE_LOGGERS, "OFF")
    assert log4j.LogManager.getRootLogger().getLevel().toString() == "ERROR"


def test_console_sink_prints_batches(env, capsys):
    env.from_source(ScriptedSource([[(7, "seven")], [(8, "eight")]], "id bigint, k string")).sink_to(ConsoleSink())
    env.execute("console", progress=False)
    out = capsys.readouterr().out
    assert "Batch: 0 (1 rows)" in out and "|7  |seven|" in out and "Batch: 1 (1 rows)" in out


def test_explain_includes_the_spark_plan(env):
    env.from_source(ScriptedSource([[(1, "a")]], "id bigint, k string")).filter("id > 0").sink_to(CollectSink())
    text = env.explain()
    assert "== Ember graph ==" in text and "== Spark plan ==" in text
    assert "== Physical Plan ==" in text and "StreamingRelation ember_scripted" in text
    assert "Filter (isnotnull(id" in text


def test_progress_callback_receives_every_batch(env):
    reports = []
    env.from_source(ScriptedSource([[(1, "a")], [(2, "b")], [(3, "c")]], "id bigint, k string")).sink_to(CollectSink())
    result = env.execute("progress", progress=reports.append)
    assert [r["batchId"] for r in reports] == list(range(result.batches))
    assert sum(r["numInputRows"] for r in reports) == 3 == result.events
    assert os.path.isdir(result.checkpoint_dir)


def test_state_backend_and_parallelism_reach_the_checkpoint(spark, tmp_path):
    """RocksDB with changelog checkpointing by default; parallelism = state partitions."""
    for parallelism, backend, provider in [(3, "rocksdb", "RocksDBStateStoreProvider"), (2, "hdfs", "HDFSBackedStateStoreProvider")]:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path / backend, spark=spark, parallelism=parallelism, state_backend=backend)
        src = env.from_source(ScriptedSource([[(1, "a")]], "ts bigint, k string"), WatermarkStrategy.for_monotonous_timestamps("ts"))
        src.key_by("k").window(TumblingEventTimeWindows.of(10)).count().sink_to(CollectSink())
        result = env.execute("state", progress=False)
        with open(os.path.join(result.checkpoint_dir, "offsets", "0")) as f:
            conf = json.loads(f.read().splitlines()[1])["conf"]
        assert conf["spark.sql.streaming.stateStore.providerClass"].endswith(provider)
        assert conf["spark.sql.shuffle.partitions"] == str(parallelism)
        state_parts = os.listdir(os.path.join(result.checkpoint_dir, "state", "0"))
        assert len([p for p in state_parts if p.isdigit()]) == parallelism
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled") == "true"


def test_ctrl_c_stops_the_job_gracefully(env):
    """An interrupt (Ctrl-C) stops between batches; the result says so and keeps what was done."""
    import signal
    import threading

    sink = CountSink()
    env.from_source(RateSource(rows_per_second=200)).sink_to(sink)
    timer = threading.Timer(6.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result = env.execute("interrupted", duration_s=60, progress=False)
    finally:
        timer.cancel()
    assert result.stopped_because == "interrupted"
    assert result.seconds < 30
    assert sink.count == result.events > 0


def test_one_driver_per_checkpoint_a_second_execute_fails_before_anything_runs(spark, tmp_path):
    """Another process holds the job's leader lock (here: another open file of this one): the
    job fails at once, naming it, and the checkpoint is left untouched; once it is released
    the job runs."""
    from ember.runner.spark.checkpoint import CheckpointLayout
    from ember.runner.spark.leader import JobAlreadyRunning, LeaderLock

    env = _env(spark, tmp_path)
    sink = CollectSink()
    env.from_source(ScriptedSource([[(1,)], [(2,)]], schema="x int"), name="xs").sink_to(sink)
    checkpoint = os.path.join(tmp_path, "twice")
    other = LeaderLock(CheckpointLayout(checkpoint).leader_lock, "twice")
    assert other.acquire(standby=False)
    with pytest.raises(JobAlreadyRunning, match=f"pid {os.getpid()}"):
        env.execute("twice", progress=False)
    assert not CheckpointLayout(checkpoint).has_progress()
    other.release("test done")
    env.execute("twice", progress=False)
    assert sorted(r["x"] for r in sink.rows()) == [1, 2]


def test_sparks_python_workers_import_the_installed_pyspark_not_its_zip(spark):
    """A Python worker Spark starts (here the UDF workers) imports pyspark from site-packages,
    with its bytecode cache (ember.runner.spark.worker_imports; ~0.7 s less per process)."""
    from pyspark.sql import functions as F

    where = F.udf(lambda _: __import__("pyspark").__file__, "string")
    (path,) = [r[0] for r in spark.range(1).select(where("id")).collect()]
    assert ".zip" not in path and path.endswith(os.path.join("site-packages", "pyspark", "__init__.py")), path


def test_sparks_python_workers_running_embers_code_collect_young_objects_after_a_task(spark):
    """In a Python worker of Spark's daemon that imported Ember's runner, the daemon's
    collection after each task is Ember's young one (ember.runner.spark.worker_gc) — fails
    if a pyspark release changes the daemon so that it no longer applies."""
    import pandas as pd

    def where(frames):
        import sys

        import ember.runner.spark  # noqa: F401 - what any of Ember's worker-side code imports

        main = sys.modules["__main__"]
        for _ in frames:
            yield pd.DataFrame({"main": [main.__spec__.name], "gc": [type(main.gc).__name__]})

    rows = {tuple(r) for r in spark.range(0, 4, 1, 2).mapInPandas(where, "main string, gc string").collect()}
    assert rows == {("pyspark.daemon", "AfterTaskCollector")}


def test_count_sink_counts_sums_and_samples_each_batch(env):
    """CountSink against the rows it was given: per batch the count, the sum of
    ``sum_field`` and one latency sample per row whose ``latency_field`` is positive (the
    arrival time minus it); an empty batch after a filter counts 0."""
    import time

    rows = [[(1, 10, "a"), (2, 0, "b"), (3, 5, "c")], [(40, 7, "d")], [(-9, 3, "e")]]
    sink = CountSink(latency_field="ts", sum_field="id")
    before = int(time.time() * 1000)
    env.from_source(ScriptedSource(rows, "id bigint, ts bigint, k string")).filter("id > -5").sink_to(sink)
    result = env.execute("counted", progress=False)
    after = int(time.time() * 1000)
    assert result.events == 5
    assert sink.count == 4 and sink.total == 1 + 2 + 3 + 40
    samples = sink.latencies_ms
    assert len(samples) == 3  # ts 10, 5 and 7; the row with ts 0 is not sampled
    assert all(before - 10 <= s <= after - 5 for s in samples)
