"""The end-of-input row's reader and the bounded sources' done marks (datasources.py): the row
comes in the micro-batch where every bounded source reads its last input — Spark asks the
sources in plan order, the scripted source first — and otherwise once the driver's marker is
there; a replayed offset stays what it was."""

import json
import os

from pyspark.sql.streaming.datasource import ReadAllAvailable

from ember.runner.spark.datasources import EndOfInputReader, ScriptedReader, SequenceReader


def _scripted(batches, done_file):
    return ScriptedReader({"batches": json.dumps(batches), "done_file": done_file, "stop_marker": ""})


def test_the_row_comes_with_the_batch_where_every_source_reads_its_last_input(tmp_path):
    marker = str(tmp_path / "end-of-input")
    a, b = _scripted([[[1]], [[2]]], marker + ".done.a"), _scripted([[[1]]], marker + ".done.b")
    eoi = EndOfInputReader({"marker": marker, "sources": "2"})
    offsets = {"a": a.initialOffset(), "b": b.initialOffset(), "eoi": eoi.initialOffset()}
    ended_in = None
    for batch in range(4):  # each micro-batch: the sources' offsets in plan order, the row's last
        offsets["a"] = a.latestOffset(offsets["a"], ReadAllAvailable())
        offsets["b"] = b.latestOffset(offsets["b"], ReadAllAvailable())
        offsets["eoi"] = eoi.latestOffset(offsets["eoi"], ReadAllAvailable())
        if offsets["eoi"]["ended"] and ended_in is None:
            ended_in = batch
    assert ended_in == 1  # a's second (last) batch; b was done in batch 0


def test_without_marks_from_every_source_only_the_drivers_marker_ends_the_input(tmp_path):
    marker = tmp_path / "end-of-input"
    a = _scripted([[[1]]], str(marker) + ".done.a")
    eoi = EndOfInputReader({"marker": str(marker), "sources": "0"})  # a source that cannot mark itself
    a.latestOffset(a.initialOffset(), ReadAllAvailable())
    assert eoi.latestOffset({"ended": 0}, ReadAllAvailable()) == {"ended": 0}
    marker.touch()
    assert eoi.latestOffset({"ended": 0}, ReadAllAvailable()) == {"ended": 1}


def test_a_bounded_generator_marks_itself_done_with_its_last_events(tmp_path):
    done = tmp_path / "end-of-input.done.gen"
    spec = {"max_events": 10, "max_events_per_batch": 6, "start_ms": 0, "partitions": 1}
    gen = SequenceReader({"spec": json.dumps(spec), "done_file": str(done), "stop_marker": ""})
    first = gen.latestOffset(gen.initialOffset(), ReadAllAvailable())
    assert first["n"] == 10 and first["done"] and done.exists()  # all at once: read all available


def test_a_source_not_yet_at_its_end_leaves_no_mark(tmp_path):
    done = tmp_path / "end-of-input.done.a"
    a = _scripted([[[1]], [[2]]], str(done))
    a.latestOffset(a.initialOffset(), ReadAllAvailable())
    assert not done.exists()


def test_done_marks_are_cleared_when_a_job_starts_and_left_out_of_savepoints(tmp_path):
    """A mark from an earlier run could end a restarted job's input before its sources read
    what was added since; a savepoint restored into another pipeline must not carry them."""
    from ember.runner.spark.checkpoint import CheckpointLayout, clear_done_marks, is_runtime_marker

    layout = CheckpointLayout(str(tmp_path))
    (tmp_path / "ember").mkdir(exist_ok=True)
    marks = [layout.end_of_input + ".done.a", layout.end_of_input + ".done.b"]
    for m in marks:
        open(m, "w").close()
    assert all(is_runtime_marker(m.rsplit("/", 1)[1]) for m in marks) and not is_runtime_marker("origin-a")
    clear_done_marks(layout.end_of_input)
    assert not any(os.path.exists(m) for m in marks)
