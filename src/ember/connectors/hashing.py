"""Spark's ``xxhash64`` of integer values, in numpy.

Generator sources compute their fields from ``xxhash64(seq, seed)`` inside
Spark; this module reproduces the same hash on the driver so that expected
results (window counts, alerts) can be computed independently of the job, and
in Python sources that put records into the same state buckets Spark's
``pmod(xxhash64(key), n)`` would (keyed/packing.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["xxhash64_long", "xxhash64_int", "spark_xxhash64", "INT_KINDS"]

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
SPARK_HASH_SEED = 42


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


# Spark hashes byte, short, int and boolean values as 4 bytes, long as 8.
INT_KINDS = {"tinyint": 4, "smallint": 4, "int": 4, "boolean": 4, "bigint": 8}


def _seed(seed: np.ndarray | int) -> np.ndarray | np.uint64:
    if isinstance(seed, int):
        return np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
    return np.asarray(seed).astype(np.int64).astype(np.uint64)


def _avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def xxhash64_long(values: np.ndarray, seed: np.ndarray | int) -> np.ndarray:
    """XXH64 of each int64 in ``values`` (as 8 little-endian bytes) with ``seed``; returns uint64."""
    with np.errstate(over="ignore"):
        v = np.asarray(values, dtype=np.int64).astype(np.uint64)
        h = _seed(seed) + _P5 + np.uint64(8)
        h = h ^ (_rotl(v * _P2, 31) * _P1)
        h = _rotl(h, 27) * _P1 + _P4
        return _avalanche(h)


def xxhash64_int(values: np.ndarray, seed: np.ndarray | int) -> np.ndarray:
    """XXH64 of each value in ``values`` as a 4-byte int with ``seed``; returns uint64."""
    with np.errstate(over="ignore"):
        v = np.asarray(values).astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
        h = _seed(seed) + _P5 + np.uint64(4)
        h = h ^ (v * _P1)
        h = _rotl(h, 23) * _P2 + _P3
        return _avalanche(h)


def spark_xxhash64(*columns: np.ndarray | int, kinds: tuple[str, ...] | None = None) -> np.ndarray:
    """Spark SQL's ``xxhash64(c1, c2, ...)`` of non-null integer columns, as int64.

    ``kinds`` are the columns' Spark types (``INT_KINDS``); all ``bigint`` by default."""
    h: np.ndarray | int = SPARK_HASH_SEED
    for i, col in enumerate(columns):
        width = INT_KINDS[kinds[i]] if kinds is not None else 8
        values = np.asarray(col)
        h = xxhash64_long(values, h) if width == 8 else xxhash64_int(values, h)
    return np.asarray(h).astype(np.int64)
