"""Vectorised JSON decoding with a reason for every record that cannot be decoded.

Two decoders, one result. The fast one (json_scan.py, compiled with numba)
validates each record in a single pass over its bytes and extracts only the
declared top-level fields; whatever it does not reproduce exactly (escapes in a
declared string, duplicate keys, fractions in integer fields, invalid JSON...)
it *refers* to the reference decoder, and float fields always go there.

The reference decoder is Arrow's JSON reader (C++, no Python per record): the
texts, each followed by a newline, are already one newline-delimited buffer in
Arrow's memory. When the reader refuses a batch — some record is not JSON, not
an object, or has a field of another type — the batch is split into runs of 1 k
records, a refused run into halves, and each part tried again, so k bad records
among n cost about one more pass over the batch plus O(k log 1k) small reader
calls, and only single records are examined in Python to say exactly what is
wrong with them.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

__all__ = ["decode_json", "fast_columns", "JSON_TYPES", "ARROW_TYPES"]

# Spark's simple type names -> Arrow types (the field types of flat records: JSON, Redis entries).
ARROW_TYPES = {
    "string": pa.string(), "binary": pa.binary(), "boolean": pa.bool_(), "tinyint": pa.int8(),
    "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(),
}
JSON_TYPES = {kind: t for kind, t in ARROW_TYPES.items() if kind != "binary"}
_PY_KINDS = {"string": (str,), "boolean": (bool,), "float": (int, float), "double": (int, float)}

Fields = tuple[tuple[str, str, bool], ...]


def decode_json(texts: pa.Array, fields: Fields) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
    """``texts`` (string or binary) -> (decoded rows of the good records, in order;
    a boolean mask of the good records; reason per bad record index)."""
    schema = _schema(fields)
    if pa.types.is_binary(texts.type) or pa.types.is_large_binary(texts.type):
        try:
            texts = texts.cast(pa.string())
        except pa.ArrowInvalid:  # some record is not UTF-8: find it record by record
            texts = pa.array([_utf8(v) for v in texts.to_pylist()], pa.string())
    fast = fast_columns(texts, fields) if _scannable(fields) else None
    if fast is None:
        table, good, reasons = _reference(texts, fields, _suspicious(texts))
    else:  # null and empty records are referred; line breaks are JSON whitespace, a matter for the reader only
        columns, refer = fast
        if not refer.any():
            table, good, reasons = pa.Table.from_arrays(columns, schema=schema), np.ones(len(texts), dtype=bool), {}
        else:  # the records the scanner referred, decoded by Arrow's reader; then back in order
            index = np.flatnonzero(refer)
            referred = texts.take(pa.array(index))
            sub, sub_good, sub_reasons = _reference(referred, fields, _suspicious(referred))
            good = np.ones(len(texts), dtype=bool)
            good[index[~sub_good]] = False
            reasons = {int(index[i]): why for i, why in sub_reasons.items()}
            accepted = pa.Table.from_arrays(columns, schema=schema).filter(pa.array(~refer))
            both = pa.concat_tables([accepted, sub])
            position = np.concatenate([np.flatnonzero(~refer), index[sub_good]])  # original index of each row
            table = both.take(pa.array(np.argsort(position, kind="stable")))
    return _check_required(table, good, reasons, fields)


def _schema(fields: Fields) -> pa.Schema:
    return pa.schema([pa.field(name, JSON_TYPES[kind]) for name, kind, _ in fields])


def _reference(texts: pa.Array, fields: Fields, suspicious: np.ndarray) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
    """Arrow's JSON reader over ``texts`` (string), bad records found and explained one by one."""
    schema = _schema(fields)
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    n = len(texts)
    reasons: dict[int, str] = {}
    pieces: list[tuple[int, pa.Table]] = []  # (first index, decoded rows of a run of good records)

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
    return table, good, reasons


def _check_required(table: pa.Table, good: np.ndarray, reasons: dict[int, str],
                    fields: Fields) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
    """Records whose NOT NULL fields are missing or null become bad records too."""
    required = [name for name, _, nullable in fields if not nullable]
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


_SCAN_KINDS = {"string": 0, "tinyint": 1, "smallint": 1, "int": 1, "bigint": 1, "double": 2, "boolean": 3}
_INT_RANGES = {"tinyint": 1 << 7, "smallint": 1 << 15, "int": 1 << 31}


def _scannable(fields: Fields) -> bool:
    """Whether the single-pass scanner covers these fields (float32 and names that
    JSON would have to escape are left to Arrow's reader)."""
    return bool(fields) and all(
        kind in _SCAN_KINDS and name.isprintable() and '"' not in name and "\\" not in name for name, kind, _ in fields
    )


def fast_columns(texts: pa.Array, fields: Fields) -> tuple[list[pa.Array], np.ndarray]:
    """One pass of the compiled scanner (json_scan.py) over ``texts`` (string):
    the declared fields as Arrow columns of every record, and the mask of the
    records it *referred* (their column values are meaningless) to the reference decoder."""
    from ember.runner.spark import json_scan

    n = len(texts)
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(texts.buffers()[1], dtype=width, count=n + 1, offset=texts.offset * np.dtype(width).itemsize)
    data = texts.buffers()[2]
    data = np.frombuffer(data if data is not None and len(data) else b"\0", dtype=np.uint8)  # read-only either way
    names = [name.encode("utf-8") for name, _, _ in fields]
    keys = np.frombuffer(b"".join(names), dtype=np.uint8) if any(names) else np.zeros(0, dtype=np.uint8)
    key_offsets = np.cumsum([0] + [len(k) for k in names]).astype(np.int64)
    kinds = np.array([_SCAN_KINDS[kind] for _, kind, _ in fields], dtype=np.int8)
    k = len(fields)
    starts = np.full((n, k), -1, dtype=np.int64)
    ends = np.empty((n, k), dtype=np.int64)
    ints = np.zeros((n, k), dtype=np.int64)
    status = np.empty(n, dtype=np.uint8)
    gathered = np.array([j for j, (_, kind, _) in enumerate(fields) if kind in ("string", "double")], dtype=np.int64)
    out = np.empty((len(gathered), len(data)), dtype=np.uint8)  # pages are touched only as far as used
    out_offsets = np.empty((len(gathered), n + 1), dtype=np.int32)
    json_scan.scan(data, offsets.astype(np.int64), keys, key_offsets, kinds, starts, ends, ints, status,
                   gathered, out, out_offsets)
    refer = status.astype(bool)
    columns = []
    for j, (_name, kind, _) in enumerate(fields):
        present = (starts[:, j] >= 0) & ~refer
        validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
        if kind in ("string", "double"):
            g = int(np.flatnonzero(gathered == j)[0])
            used = int(out_offsets[g, n])
            column = pa.Array.from_buffers(pa.string(), n, [validity, pa.py_buffer(out_offsets[g]),
                                                            pa.py_buffer(out[g, :used])])
            if kind == "double":
                column = column.cast(pa.float64())
        elif kind == "boolean":
            column = pa.array(ints[:, j] == 1, pa.bool_(), mask=~present)
        else:
            values = ints[:, j]
            bound = _INT_RANGES.get(kind)
            if bound is not None:
                refer |= present & ((values < -bound) | (values >= bound))  # out of range: the reader explains
                values = np.where(present & ~refer, values, 0)
            column = pa.array(values.astype(JSON_TYPES[kind].to_pandas_dtype()), JSON_TYPES[kind], mask=~present)
        columns.append(column)
    return columns, refer


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
    row: dict[str, Any] = {}
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
