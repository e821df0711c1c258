"""Sources read in the driver (Spark's simple reader, datasources.py): the same offsets and rows
as the readers whose Python tasks read each partition, and chosen only where batches stay small."""

import json

import pyarrow as pa
import pytest
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.streaming.datasource import ReadAllAvailable

from ember import CountSink, GroupingSource, StreamEnvironment
from ember.runner.spark.datasources import (
    ScriptedReader,
    ScriptedSourceDS,
    SequenceReader,
    SequenceSource,
)
from ember.runner.spark.generator_batches import source_spec
from ember.runner.spark.in_driver import InDriver
from ember.runner.spark.translators.sources import IN_DRIVER_SWITCH


def _rows(batches):
    out = []
    for b in batches:
        out.extend(b.to_pylist() if isinstance(b, pa.RecordBatch) else [b])
    return out


def test_the_scripted_script_read_in_the_driver_gives_the_offsets_and_rows_of_the_tasks(tmp_path):
    batches = [[[1, "a"], [2, "b"]], [], [[3, "c"]]]
    options = {"batches": json.dumps(batches), "done_file": str(tmp_path / "done"), "stop_marker": ""}
    tasks, driver = ScriptedReader(options), InDriver(ScriptedReader(options))
    start = tasks.initialOffset()
    assert driver.initialOffset() == start
    for _ in range(3):
        rows, end = driver.read(start)
        assert end == tasks.latestOffset(start, ReadAllAvailable())
        expected = [r for part in tasks.partitions(start, end) for r in tasks.read(part)]
        assert list(rows) == expected == list(driver.readBetweenOffsets(start, end))  # (a replay: the same)
        start = end
    assert start["done"] and (tmp_path / "done").exists()


def test_a_generator_read_in_the_driver_gives_every_partitions_rows_of_the_batch(tmp_path):
    src = GroupingSource(partitions=2, max_events=25_000)
    options = {"spec": json.dumps(source_spec(src, 10_000)), "done_file": "", "stop_marker": "",
               "origin_file": str(tmp_path / "origin"), "bound_file": ""}
    tasks, driver = SequenceReader(options), InDriver(SequenceReader(options))
    start = tasks.initialOffset()
    seen = []
    while not start["done"]:
        rows, end = driver.read(start)
        assert end == tasks.latestOffset(start, tasks.getDefaultReadLimit())
        assert end["n"] - start["n"] == 10_000 or end["done"]  # the batch bound holds
        expected = _rows(b for part in tasks.partitions(start, end) for b in tasks.read(part))
        got = _rows(rows)
        assert got == expected == _rows(driver.readBetweenOffsets(start, end))
        seen.extend(r["seq"] for r in got)
        start = end
    assert sorted(seen) == list(range(25_000))


def test_only_sources_asked_to_read_in_the_driver_do():
    base = {"schema": "seq bigint", "spec": "{}", "batches": "[]"}
    for source, reader in ((SequenceSource, SequenceReader), (ScriptedSourceDS, ScriptedReader)):
        with pytest.raises(PySparkNotImplementedError):  # pyspark then asks for the simple reader
            source({**base, "in_driver": "1"}).streamReader(None)
        assert isinstance(source({**base, "in_driver": "0"}).streamReader(None), reader)
        assert isinstance(source(base).streamReader(None), reader)


def test_a_generator_reads_in_the_driver_only_where_its_batches_stay_small_and_unfused(monkeypatch):
    from ember.runner.spark.compilation import Compilation
    from ember.runner.spark.translators.sources import IN_DRIVER_BELOW_MS, IN_DRIVER_MAX_EVENTS, _reads_in_driver

    def comp(target):
        env = StreamEnvironment(master="local[2]", latency_target=target)
        env.from_source(GroupingSource(), name="g").sink_to(CountSink())
        return Compilation(env.graph(), None, env.config, "x", None)

    big = IN_DRIVER_MAX_EVENTS + 1
    assert _reads_in_driver(comp(250), {}, big) and not _reads_in_driver(comp(250), {"pack": "{}"}, big)
    assert not _reads_in_driver(comp(IN_DRIVER_BELOW_MS), {}, big) and not _reads_in_driver(comp(None), {}, big)
    assert _reads_in_driver(comp(None), {}, IN_DRIVER_MAX_EVENTS) and not _reads_in_driver(comp(None), {"decode": "{}"}, 5)
    monkeypatch.setenv(IN_DRIVER_SWITCH, "tasks")  # the switch, read where the job compiles
    assert not _reads_in_driver(comp(250), {}, 5)


class _Backlog:
    """A task reader whose offset moves when told and which reports a backlog, as the Redis one does."""

    def __init__(self):
        self.n, self.added = 0, 0

    def getDefaultReadLimit(self):
        return ReadAllAvailable()

    def latestOffset(self, start, limit):
        return {"n": self.n}

    def reportLatestOffset(self):
        return {"added": {"s": self.added}}

    def partitions(self, start, end):
        return list(range(start["n"], end["n"]))

    def read(self, part):
        yield (part,)


def test_the_backlog_report_travels_in_the_end_offset_and_never_makes_a_batch_alone():
    inner = _Backlog()
    driver = InDriver(inner)
    inner.n, inner.added = 2, 5
    rows, end = driver.read({"n": 0})
    assert (list(rows), end) == ([(0,), (1,)], {"n": 2, "added": {"s": 5}})
    inner.added = 9  # more entries added, none admitted: the same position, so no batch
    rows, again = driver.read(end)
    assert (list(rows), again) == ([], end)
    assert list(driver.readBetweenOffsets({"n": 0}, end)) == [(0,), (1,)]  # a replay ignores the report
