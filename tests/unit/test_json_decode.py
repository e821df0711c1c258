"""Vectorised JSON decoding: good records decoded in order, every bad one with its reason."""

import json

import pyarrow as pa
import pytest

from ember.runner.spark.json_decode import decode_json

FIELDS = (("ad_id", "string", False), ("event_time", "bigint", True), ("n", "tinyint", True), ("x", "double", True))


def test_bulk_path_decodes_declared_fields_and_ignores_others():
    texts = pa.array([json.dumps({"ad_id": f"a{i}", "event_time": i, "x": 1, "other": {"deep": [1]}}) for i in range(5000)])
    table, good, reasons = decode_json(texts, FIELDS)
    assert reasons == {} and good.all()
    assert table.column("ad_id").to_pylist() == [f"a{i}" for i in range(5000)]
    assert table.column("event_time").to_pylist() == list(range(5000))
    assert table.column("x").to_pylist() == [1.0] * 5000 and table.column("n").null_count == 5000


@pytest.mark.parametrize(
    "text, reason",
    [
        ("not json", "invalid JSON: Expecting value at character 0"),
        ('{"ad_id": "a"} {"ad_id": "b"}', "invalid JSON: Extra data"),
        ("[1, 2]", "not a JSON object but an array"),
        ("42", "not a JSON object but a number"),
        ('{"ad_id": 7}', "field 'ad_id': expected string, got a number 7"),
        ('{"ad_id": "a", "event_time": "12"}', "field 'event_time': expected bigint, got a string \"12\""),
        ('{"ad_id": "a", "event_time": 1.5}', "field 'event_time': expected bigint, got a number 1.5"),
        ('{"ad_id": "a", "n": true}', "field 'n': expected tinyint, got a boolean true"),
        ('{"ad_id": "a", "n": 300}', "field 'n': 300 is out of range for tinyint"),
        ('{"event_time": 1}', "field 'ad_id' is missing or null (declared NOT NULL)"),
        ('{"ad_id": null}', "field 'ad_id' is missing or null (declared NOT NULL)"),
        ("   ", "the record is empty"),
        (None, "the record is null"),
    ],
)
def test_each_bad_record_gets_its_reason_among_good_ones(text, reason):
    texts = [json.dumps({"ad_id": f"a{i}", "event_time": i}) for i in range(3000)]
    texts[1234] = text
    table, good, reasons = decode_json(pa.array(texts, pa.string()), FIELDS)
    assert list(reasons) == [1234] and reasons[1234].startswith(reason)
    assert not good[1234] and good.sum() == 2999
    assert table.column("ad_id").to_pylist() == [f"a{i}" for i in range(3000) if i != 1234]


def test_line_breaks_inside_a_record_and_binary_input():
    texts = pa.array([b'{"ad_id":\n"a"}', b'{"ad_id": "b"}', b"\xff\xfe", b'{"ad_id": "c",\r\n "x": 2}'])
    table, good, reasons = decode_json(texts, FIELDS)
    assert table.column("ad_id").to_pylist() == ["a", "b", "c"]
    assert list(reasons) == [2] and reasons[2].startswith("invalid JSON")
