"""Writing JSON texts with compiled code (numba): the JSON Yahoo generator's records.

Every record is the same literal fragments around a few chosen values, so it is
written by copying bytes (``json_scan.copy_bytes``, the scanner's vectorised copy)
and the event time's digits: no Python object, no json.dumps per record. The
result is byte for byte ``json.dumps(record, separators=(",", ":"))`` (tested).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ember.runner.spark.json_scan import copy_bytes

__all__ = ["write_yahoo"]

_MINUS, _ZERO = 45, 48  # "-", "0"


@njit(cache=True, nogil=True)
def write_yahoo(picks, times, literals, literal_offsets, values, value_offsets, firsts, cut, offsets):
    """Records ``literal 0, value 0, literal 1, ..., value 5 (the time's digits), literal 6``:
    value ``f`` of record ``r`` is choice ``picks[f, r]`` of field ``f`` (its bytes:
    ``values[value_offsets[firsts[f] + pick]:...]``); a record with ``cut[r]`` loses its
    last byte. Returns the bytes; ``offsets`` (one more than records) receives the Arrow offsets."""
    n = len(times)
    fixed = literal_offsets[-1]
    longest = 0
    for k in range(len(value_offsets) - 1):
        longest = max(longest, value_offsets[k + 1] - value_offsets[k])
    out = np.empty(n * (fixed + picks.shape[0] * longest + 20), dtype=np.uint8)
    digits = np.empty(20, dtype=np.uint8)
    p = 0
    offsets[0] = 0
    for r in range(n):
        for f in range(picks.shape[0] + 1):
            a = literal_offsets[f]
            copy_bytes(literals, a, literal_offsets[f + 1] - a, out, p)
            p += literal_offsets[f + 1] - a
            if f < picks.shape[0]:
                k = firsts[f] + picks[f, r]
                a = value_offsets[k]
                copy_bytes(values, a, value_offsets[k + 1] - a, out, p)
                p += value_offsets[k + 1] - a
        t = times[r]  # the time's digits, between the last two literals
        if t < 0:
            out[p] = _MINUS
            p += 1
            t = -t
        d = 0
        while True:
            digits[d] = _ZERO + t % 10
            t //= 10
            d += 1
            if t == 0:
                break
        for j in range(d - 1, -1, -1):
            out[p] = digits[j]
            p += 1
        a = literal_offsets[picks.shape[0] + 1]
        copy_bytes(literals, a, literal_offsets[picks.shape[0] + 2] - a, out, p)
        p += literal_offsets[picks.shape[0] + 2] - a
        if cut[r]:
            p -= 1
        offsets[r + 1] = p
    return out[:p]
