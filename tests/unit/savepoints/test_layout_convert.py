"""Restoring into another state layout, the checks and manifests around it
(savepoints/convert.py) and a converted checkpoint's source positions (checkpoint.start_offset);
the conversion itself runs on Spark in tests/integration/test_layout_conversion.py."""

from __future__ import annotations

import json

import pytest

from ember import CollectSink, RateSource, ScriptedSource, StreamEnvironment
from ember.errors import EmberError, SavepointError
from ember.runner.spark.checkpoint import (
    BY_SOURCE,
    GROUP_TIMEOUTS,
    SOURCE_ID_OPTION,
    START_OFFSETS_OPTION,
    start_offset,
)
from ember.savepoints.convert import as_converted, check_convertible, converted_manifest, layout_changes

TWS, APWS = "transformWithStateInPandas", "applyInPandasWithState"


def _op(name, kind="process function", **extra):
    return {"name": name, "kind": kind, "keys": ["k"], "state": {}, **extra}


def _manifest(*ops):
    return {"version": 1, "sources": [], "bounded": False, "operators": list(ops)}


def test_the_steps_whose_layout_differs_are_found_by_position_and_kind():
    stored = _manifest(_op("a", **{"spark operator": APWS}), _op("w", "window", **{"spark operator": APWS}))
    current = _manifest(_op("a", **{"spark operator": TWS, "state layout": "delta"}),
                        _op("w2", "window", **{"spark operator": TWS, "state layout": "delta"}))
    assert layout_changes(stored, current) == ["a", "w2"]
    assert layout_changes(stored, stored) == []
    assert layout_changes(_manifest(_op("a")), _manifest(_op("a", "vectorised process function", **{"state layout": "delta"}))) == []


def test_a_granted_conversion_leaves_every_other_difference_to_compare():
    stored = _manifest(_op("a", **{"spark operator": APWS}))
    current = _manifest(_op("a", **{"spark operator": TWS, "state layout": "delta"}))
    granted = as_converted(stored, current)
    assert granted["operators"][0]["state layout"] == "delta" and granted["operators"][0]["spark operator"] == TWS
    assert stored["operators"][0] == _op("a", **{"spark operator": APWS}), "the savepoint's manifest was changed"
    back = as_converted(current, stored)  # delta -> blob: the layout field goes
    assert "state layout" not in back["operators"][0]


def test_the_converted_checkpoint_keeps_its_keyed_steps_on_transform_with_state():
    manifest = converted_manifest(_manifest(_op("a", **{"spark operator": APWS}), _op("n", "window aggregate")))
    assert manifest["operators"][0]["spark operator"] == TWS
    assert "spark operator" not in manifest["operators"][1]
    assert GROUP_TIMEOUTS in manifest


def _graph(source):
    env = StreamEnvironment(master="local[1]")
    env.from_source(source, name="src").sink_to(CollectSink())
    return env.graph()


def _savepoint(*ops, partitions=2):
    return {"pipeline": _manifest(*ops), "partitions": partitions}


@pytest.mark.parametrize(("op", "why"), [
    (_op("j", "interval join"), r"'j' is an interval join: .*Spark's own operators take no initial state"),
    (_op("n", "window aggregate"), r"'n' is a window aggregate"),
    (_op("q", "sql"), r"'q' is a sql"),
])
def test_state_that_cannot_be_handed_on_is_refused_naming_the_step(op, why):
    with pytest.raises(SavepointError, match=why):
        check_convertible("sp", _savepoint(_op("ok"), op), _graph(ScriptedSource([[(1,)]], "x int")), None)


def test_sources_spark_reads_and_other_settings_are_refused():
    with pytest.raises(SavepointError, match=r"source 'src' \(RateSource\).*savepoint's position"):
        check_convertible("sp", _savepoint(_op("ok")), _graph(RateSource(rows_per_second=5)), None)
    graph = _graph(ScriptedSource([[(1,)]], "x int"))
    with pytest.raises(SavepointError, match=r"parallelism 4 differs from the savepoint's 2"):
        check_convertible("sp", _savepoint(_op("ok")), graph, 4)
    with pytest.raises(SavepointError, match=r"state_backend='hdfs'.*needs 'rocksdb'"):
        check_convertible("sp", _savepoint(_op("ok")), graph, None, "hdfs")
    check_convertible("sp", _savepoint(_op("ok"), _op("w", "window"), _op("v", "vectorised process function"),
                                       _op("b", "broadcast process function"), _op("l", lane=1), _op("j", "window join"),
                                       _op("i", "keyed interval join")), graph, 2)  # (nothing to refuse)


def test_a_source_starts_where_the_converted_checkpoint_says(tmp_path):
    path = tmp_path / "start-offsets.json"
    options = {START_OFFSETS_OPTION: str(path), SOURCE_ID_OPTION: "events"}
    assert start_offset(options, {"batch": 0}) == {"batch": 0}  # not a converted checkpoint
    path.write_text(json.dumps({BY_SOURCE: {"events": json.dumps({"batch": 4, "done": False, "n": 17})}}))
    assert start_offset(options, {"batch": 0}) == {"batch": 4, "done": False, "n": 17}
    with pytest.raises(EmberError, match=r"no position for source 'other'.*read its input again"):
        start_offset({**options, SOURCE_ID_OPTION: "other"}, {"batch": 0})
