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


# --------------------------------------------------------------------------- the compiled scanner
def _reference_only(texts, fields):
    from ember.runner.spark import json_decode as d

    return d._check_required(*d._reference(texts, fields, d._suspicious(texts)), fields)


def _random_value(rng, depth=0):
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice(["", "plain", "tab\there", 'quote"d', "back\\slash", "uni\u00e9\u4e2d\U0001f600", "\u0001ctl"])
    if kind == 1:
        return rng.choice([0, 7, -12, 2**31, -(2**63), 2**63 - 1, 10**20])
    if kind == 2:
        return rng.choice([0.5, -1e-7, 3.141592653589793, 1e300, 2.5e-300, 123456789.125])
    if kind == 3:
        return rng.choice([True, False])
    if kind in (4, 5):
        return None
    if kind in (6, 7):
        return {f"k{j}": _random_value(rng, depth + 1) for j in range(rng.randrange(4))}
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


_OF_KIND = {
    "string": ["", "plain", "tab\there", 'quote"d', "uni\u00e9\u4e2d\U0001f600", "x" * 70],
    "bigint": [0, -1, 42, 2**62, -(2**62), 2**63 - 1],
    "int": [0, -7, 2**31 - 1, -(2**31), 2**31],
    "smallint": [1, -(2**15), 2**15 - 1, 2**15],
    "double": [0, -3, 0.1, 1e-300, -2.5e17, 6.02214076e23, 1.7976931348623157e308],
    "boolean": [True, False],
}


def _random_record(rng, fields):
    record = {}
    names = [name for name, _, _ in fields]
    for name, kind, _ in list(fields) + [("other", "", True), ("nested", "", True), ("list", "", True)]:
        if rng.random() < 0.9:
            choices = _OF_KIND.get(kind)
            record[name] = rng.choice(choices) if choices and rng.random() < 0.9 else _random_value(rng)
    text = json.dumps(record, ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": ")]))
    roll = rng.random()
    if roll < 0.05:  # a declared key twice
        text = text[:-1] + (", " if len(record) else "") + f'"{rng.choice(names)}": 1' + "}"
    elif roll < 0.10:  # cut short
        text = text[: rng.randrange(len(text))]
    elif roll < 0.15:  # one byte changed
        i = rng.randrange(len(text))
        text = text[:i] + rng.choice('{}[]",:0-eE.\\ ntfx') + text[i + 1:]
    elif roll < 0.18:
        text = " \t" + text + "  "
    elif roll < 0.20:
        text = text.replace(":", ": -0", 1) if ": " not in text else text
    return text


@pytest.mark.parametrize("seed", range(2))
def test_scanner_and_reader_agree_on_random_and_damaged_records(seed):
    import random

    rng = random.Random(seed)
    kinds = ["string", "bigint", "int", "double", "boolean", "smallint"]
    fields = tuple((f"f{j}", kind, rng.random() < 0.7) for j, kind in enumerate(kinds))
    texts = pa.array([_random_record(rng, fields) for _ in range(2500)], pa.string())
    table, good, reasons = decode_json(texts, fields)
    ref_table, ref_good, ref_reasons = _reference_only(texts, fields)
    assert (good == ref_good).all() and reasons == ref_reasons
    assert table.equals(ref_table)
    assert 300 < good.sum() < 2400  # both kinds of record really occur


def test_the_scanner_accepts_plain_records_and_refers_what_it_does_not_reproduce():
    from ember.runner.spark.json_decode import fast_columns

    fields = (("s", "string", True), ("i", "bigint", True), ("d", "double", True), ("b", "boolean", True))
    texts = [
        '{"s": "x", "i": -5, "d": 2.5e3, "b": true, "skip": [1, {"a": "\\u00e9"}]}',  # accepted
        '{"s": null, "i": null}',                                                  # accepted: nulls
        '{"s": "esc\\"aped"}',                                                      # referred: escape in a declared string
        '{"i": 1.0}',                                                               # referred: fraction in an integer
        '{"s": "a", "s": "b"}',                                                     # referred: duplicate key
        '{"i": 99999999999999999999}',                                             # referred: beyond int64
        '{"s": 5}',                                                                 # referred: another type
        '{"s": "x"} x',                                                             # referred: trailing data
    ]
    columns, refer = fast_columns(pa.array(texts), fields)
    assert refer.tolist() == [False, False, True, True, True, True, True, True]
    assert [c[0].as_py() for c in columns] == ["x", -5, 2500.0, True]
    assert [c[1].as_py() for c in columns] == [None, None, None, None]
    table, good, reasons = decode_json(pa.array(texts), fields)
    assert table.column("s").to_pylist() == ["x", None, 'esc"aped', "b"]  # the reader keeps the last duplicate
    assert sorted(reasons) == [3, 5, 6, 7]
