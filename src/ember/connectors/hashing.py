"""Spark's ``xxhash64`` of long values, in numpy.

Generator sources compute their fields from ``xxhash64(seq, seed)`` inside
Spark; this module reproduces the same hash on the driver so that expected
results (window counts, alerts) can be computed independently of the job.
"""

from __future__ import annotations

import numpy as np

__all__ = ["xxhash64_long", "spark_xxhash64"]

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
SPARK_HASH_SEED = 42


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def xxhash64_long(values: np.ndarray, seed: np.ndarray | int) -> np.ndarray:
    """XXH64 of each int64 in ``values`` (as 8 little-endian bytes) with ``seed``; returns uint64."""
    with np.errstate(over="ignore"):
        v = np.asarray(values, dtype=np.int64).astype(np.uint64)
        s = np.asarray(seed).astype(np.int64).astype(np.uint64) if not isinstance(seed, int) else np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
        h = s + _P5 + np.uint64(8)
        h = h ^ (_rotl(v * _P2, 31) * _P1)
        h = _rotl(h, 27) * _P1 + _P4
        h = h ^ (h >> np.uint64(33))
        h = h * _P2
        h = h ^ (h >> np.uint64(29))
        h = h * _P3
        h = h ^ (h >> np.uint64(32))
    return h


def spark_xxhash64(*columns: np.ndarray | int) -> np.ndarray:
    """Spark SQL's ``xxhash64(c1, c2, ...)`` for bigint columns, as int64."""
    h: np.ndarray | int = SPARK_HASH_SEED
    for col in columns:
        h = xxhash64_long(np.asarray(col, dtype=np.int64), h)
    return np.asarray(h).astype(np.int64)
