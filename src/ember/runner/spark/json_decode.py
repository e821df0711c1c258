"""Vectorised JSON decoding with a reason for every record that cannot be decoded.

A batch of JSON texts is parsed in one call to Arrow's JSON reader (C++, no
Python per record): the texts, each followed by a newline, are already one
newline-delimited buffer in Arrow's memory. When the reader refuses a batch —
some record is not JSON, not an object, or has a field of another type — the
batch is split into runs of 1 k records, a refused run into halves, and each
part tried again, so k bad records among n cost about one more pass over the
batch plus O(k log 1k) small reader calls, and only single records are examined in Python
to say exactly what is wrong with them.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ember.runner.spark.redis_source import ARROW_TYPES

__all__ = ["decode_json", "JSON_TYPES"]

JSON_TYPES = {kind: t for kind, t in ARROW_TYPES.items() if kind != "binary"}
_PY_KINDS = {"string": (str,), "boolean": (bool,), "float": (int, float), "double": (int, float)}

Fields = tuple[tuple[str, str, bool], ...]


def decode_json(texts: pa.Array, fields: Fields) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
    """``texts`` (string or binary) -> (decoded rows of the good records, in order;
    a boolean mask of the good records; reason per bad record index)."""
    schema = pa.schema([pa.field(name, JSON_TYPES[kind]) for name, kind, _ in fields])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    required = [name for name, _, nullable in fields if not nullable]
    n = len(texts)
    reasons: dict[int, str] = {}
    pieces: list[tuple[int, pa.Table]] = []  # (first index, decoded rows of a run of good records)
    if pa.types.is_binary(texts.type) or pa.types.is_large_binary(texts.type):
        try:
            texts = texts.cast(pa.string())
        except pa.ArrowInvalid:  # some record is not UTF-8: find it record by record
            texts = pa.array([_utf8(v) for v in texts.to_pylist()], pa.string())
    suspicious = _suspicious(texts)

    def parse(lo: int, hi: int) -> None:
        if hi <= lo:
            return
        part = texts.slice(lo, hi - lo)
        if not suspicious[lo:hi].any():
            table = _read(part, options)
            if table is not None and table.num_rows == hi - lo:
                pieces.append((lo, table))
                return
        if hi - lo == 1:
            row, reason = _one(texts[lo].as_py(), fields)
            if reason is None:
                pieces.append((lo, pa.Table.from_pylist([row], schema=schema)))
            else:
                reasons[lo] = reason
            return
        step = 1024 if hi - lo > 4096 else (hi - lo + 1) // 2  # large: runs of 1 k, then halves
        for start in range(lo, hi, step):
            parse(start, min(hi, start + step))

    parse(0, n)
    pieces.sort(key=lambda p: p[0])
    table = pa.concat_tables([t for _, t in pieces]) if pieces else schema.empty_table()
    good = np.ones(n, dtype=bool)
    if reasons:
        good[list(reasons)] = False
    if required and table.num_rows:  # NOT NULL fields that are missing or null
        missing = np.zeros(table.num_rows, dtype=bool)
        for name in required:
            missing |= table.column(name).is_null().to_numpy(zero_copy_only=False)
        if missing.any():
            positions = np.flatnonzero(good)
            for row in np.flatnonzero(missing):
                index = int(positions[row])
                absent = [f for f in required if table.column(f)[int(row)].as_py() is None]
                reasons[index] = f"field '{absent[0]}' is missing or null (declared NOT NULL)"
                good[index] = False
            table = table.filter(pa.array(~missing))
    return table, good, reasons


def _utf8(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" + value.decode("utf-8", "replace")  # not JSON text: fails below with this text shown


def _suspicious(texts: pa.Array) -> np.ndarray:
    """Records the bulk reader would misread: null, empty, or holding a line break
    (found with one scan of the data buffer, not a string kernel per record)."""
    n = len(texts)
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    if texts.null_count:
        out |= texts.is_null().to_numpy(zero_copy_only=False)
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(texts.buffers()[1], dtype=width, count=n + 1, offset=texts.offset * np.dtype(width).itemsize)
    out |= np.diff(offsets) == 0
    data = texts.buffers()[2]
    if data is not None and offsets[-1] > offsets[0]:
        body = np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]]
        breaks = np.flatnonzero((body == 10) | (body == 13)) + offsets[0]
        if len(breaks):
            out[np.searchsorted(offsets, breaks, side="right") - 1] = True
    return out


def _read(texts: pa.Array, options: pj.ParseOptions) -> pa.Table | None:
    joined = pc.binary_join_element_wise(texts, pa.scalar("", pa.string()), "\n")  # each text + "\n"
    offsets = joined.buffers()[1]
    start = int(np.frombuffer(offsets, dtype=np.int32, count=1, offset=joined.offset * 4)[0])
    end = int(np.frombuffer(offsets, dtype=np.int32, count=1, offset=(joined.offset + len(joined)) * 4)[0])
    data = joined.buffers()[2]
    buf = data[start:end] if data is not None else b""
    try:
        return pj.read_json(
            io.BytesIO(buf),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, end - start + 1)),
            parse_options=options,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _one(text: str | None, fields: Fields) -> tuple[dict[str, Any] | None, str | None]:
    """One record, decoded in Python with the reason it is bad (None when it is not)."""
    if text is None:
        return None, "the record is null"
    if not text.strip():
        return None, "the record is empty"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return None, f"invalid JSON: {getattr(exc, 'msg', exc)} at character {getattr(exc, 'pos', '?')}"
    if not isinstance(value, dict):
        return None, f"not a JSON object but {_json_kind(value)}"
    row = {}
    for name, kind, nullable in fields:
        v = value.get(name)
        if v is None:
            if not nullable:
                return None, f"field '{name}' is missing or null (declared NOT NULL)"
            row[name] = None
            continue
        ok = _PY_KINDS.get(kind, (int,))
        if not isinstance(v, ok) or (isinstance(v, bool) and kind != "boolean"):
            return None, f"field '{name}': expected {kind}, got {_json_kind(v)} {json.dumps(v)[:60]}"
        try:
            pa.array([v], JSON_TYPES[kind])
        except (pa.ArrowInvalid, OverflowError):
            return None, f"field '{name}': {v} is out of range for {kind}"
        row[name] = v
    return row, None


def _json_kind(v: Any) -> str:
    for kind, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
                       (list, "an array"), (dict, "an object")):
        if isinstance(v, kind):
            return name
    return "null"
