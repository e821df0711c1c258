"""Single-pass JSON field extraction, compiled to machine code with numba.

``scan`` walks the bytes of every record once: it validates the whole record
against the JSON grammar (RFC 8259: strings with their escapes, numbers,
literals, nested objects and arrays) and notes, for the few top-level keys the
pipeline declared, where each value's text lies (or, for integers and booleans,
the value itself). Nothing else is decoded: no Python object, no Arrow builder,
no value of a field nobody reads.

The fast path is deliberately narrow. A record is marked *refer* (status 1) —
to be decoded by the reference decoder, Arrow's JSON reader, which also says
why a bad record is bad — whenever anything is outside what the scanner
reproduces exactly: a declared string holding an escape, a key with an escape,
a declared key seen twice, an integer field holding a fraction, exponent or
``-0``, a value of another JSON type, nesting deeper than 64, invalid JSON.
So the scanner never has to agree with the reference on an error, only on the
values of the records it accepts, which the tests check against Python's json
module on generated and mutated records.
"""

from __future__ import annotations

import numpy as np
from numba import int64, njit, uint64

__all__ = ["scan", "copy_bytes", "STRING", "INTEGER", "NUMBER", "BOOLEAN", "MAX_DEPTH"]

STRING, INTEGER, NUMBER, BOOLEAN = 0, 1, 2, 3
MAX_DEPTH = 64

_QUOTE, _BACKSLASH, _COLON, _COMMA = 34, 92, 58, 44
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 123, 125, 91, 93
_MINUS, _PLUS, _DOT, _ZERO, _NINE = 45, 43, 46, 48, 57
_INT64_MAX_DIV10, _INT64_MAX_LAST = 922337203685477580, 7


@njit(cache=True, nogil=True, inline="always")
def _ws(data, i, end):
    while i < end:
        c = data[i]
        if c != 32 and c != 10 and c != 13 and c != 9:
            break
        i += 1
    return i


@njit(cache=True, nogil=True, inline="always")
def _hex(c):
    return (48 <= c <= 57) or (65 <= c <= 70) or (97 <= c <= 102)


# Byte classes inside a string: 0 ordinary, 1 quote, 2 backslash, 3 control character (invalid).
_STRING_CLASS = np.zeros(256, dtype=np.uint8)
_STRING_CLASS[:32] = 3
_STRING_CLASS[_QUOTE] = 1
_STRING_CLASS[_BACKSLASH] = 2


@njit(cache=True, nogil=True, inline="always")
def _string(data, i, end):
    """``i`` just after an opening quote -> (index of the closing quote, escapes seen), or (-1, 0) if invalid."""
    escaped = 0
    table = _STRING_CLASS
    j, stop = uint64(i), uint64(end)  # unsigned: no negative-index handling in the hot loop
    while j < stop and table[data[j]] == 0:
        j += uint64(1)
    i = int64(j)
    while i < end:
        c = table[data[i]]
        if c == 0:
            i += 1
            continue
        if c == 1:
            return i, escaped
        if c == 3 or i + 1 >= end:
            return -1, 0
        escaped = 1
        e = data[i + 1]
        if e == 117:  # \uXXXX
            if i + 5 >= end:
                return -1, 0
            for j in range(i + 2, i + 6):
                if not _hex(data[j]):
                    return -1, 0
            i += 6
            continue
        if e == _QUOTE or e == _BACKSLASH or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116:
            i += 2
            continue
        return -1, 0
    return -1, 0


@njit(cache=True, nogil=True, inline="always")
def _digits(data, i, end):
    """The index after the run of decimal digits starting at ``i``."""
    while i < end and _ZERO <= data[i] <= _NINE:
        i += 1
    return i


@njit(cache=True, nogil=True, inline="always")
def _number(data, i, end):
    """A JSON number starting at ``i`` -> (index after it, is an integer), or (-1, 0) if invalid."""
    if i < end and data[i] == _MINUS:
        i += 1
    if i >= end:
        return -1, 0
    c = data[i]
    if c == _ZERO:
        i += 1
    elif 49 <= c <= 57:
        i = _digits(data, i + 1, end)
    else:
        return -1, 0
    integer = 1
    if i < end and data[i] == _DOT:  # a fraction: one digit at least
        integer = 0
        start = i + 1
        i = _digits(data, start, end)
        if i == start:
            return -1, 0
    if i < end and (data[i] == 101 or data[i] == 69):  # an exponent: e/E, a sign, one digit at least
        integer = 0
        i += 1
        if i < end and (data[i] == _PLUS or data[i] == _MINUS):
            i += 1
        start = i
        i = _digits(data, start, end)
        if i == start:
            return -1, 0
    return i, integer


@njit(cache=True, nogil=True, inline="always")
def _literal(data, i, end):
    """true / false / null at ``i`` -> (index after it, 1 / 0 / -1), or (-1, 0) if none."""
    c = data[i]
    if c == 116 and i + 4 <= end and data[i + 1] == 114 and data[i + 2] == 117 and data[i + 3] == 101:
        return i + 4, 1
    if (c == 102 and i + 5 <= end and data[i + 1] == 97 and data[i + 2] == 108 and data[i + 3] == 115
            and data[i + 4] == 101):
        return i + 5, 0
    if c == 110 and i + 4 <= end and data[i + 1] == 117 and data[i + 2] == 108 and data[i + 3] == 108:
        return i + 4, -1
    return -1, 0


@njit(cache=True, nogil=True)
def _member_key(data, i, end):
    """An object member's key and colon at ``i`` -> index after the colon, or -1."""
    if i >= end or data[i] != _QUOTE:
        return -1
    i, _ = _string(data, i + 1, end)
    if i < 0:
        return -1
    i = _ws(data, i + 1, end)
    if i >= end or data[i] != _COLON:
        return -1
    return i + 1


@njit(cache=True, nogil=True)
def _skip(data, i, end, stack):
    """Validates the JSON value starting at ``i`` (whitespace skipped) -> index after it, or -1."""
    depth = 0
    while True:
        i = _ws(data, i, end)
        if i >= end:
            return -1
        c = data[i]
        # a value starts at i
        if c == _LBRACE or c == _LBRACKET:
            i = _ws(data, i + 1, end)
            if i >= end:
                return -1
            close = _RBRACE if c == _LBRACE else _RBRACKET
            if data[i] == close:
                i += 1
            else:
                if depth >= MAX_DEPTH:
                    return -1
                stack[depth] = c
                depth += 1
                if c == _LBRACE:  # the first key
                    i = _member_key(data, i, end)
                    if i < 0:
                        return -1
                continue
        elif c == _QUOTE:
            i, _ = _string(data, i + 1, end)
            if i < 0:
                return -1
            i += 1
        elif c == _MINUS or _ZERO <= c <= _NINE:
            i, _ = _number(data, i, end)
            if i < 0:
                return -1
        else:
            i, _ = _literal(data, i, end)
            if i < 0:
                return -1
        # after a complete value: close containers or move to the next element
        while True:
            if depth == 0:
                return i
            i = _ws(data, i, end)
            if i >= end:
                return -1
            c = data[i]
            top = stack[depth - 1]
            if c == _COMMA:
                i += 1
                if top == _LBRACE:
                    i = _member_key(data, _ws(data, i, end), end)
                    if i < 0:
                        return -1
                break  # the next value
            if (top == _LBRACE and c == _RBRACE) or (top == _LBRACKET and c == _RBRACKET):
                depth -= 1
                i += 1
                continue
            return -1


@njit(cache=True, nogil=True, inline="always")
def _key_index(data, ks, ke, keys, key_offsets):
    n = ke - ks
    for k in range(len(key_offsets) - 1):
        a, b = key_offsets[k], key_offsets[k + 1]
        if b - a != n:
            continue
        same = True
        for j in range(n):
            if data[ks + j] != keys[a + j]:
                same = False
                break
        if same:
            return k
    return -1


@njit(cache=True, nogil=True)
def _record(data, i, end, keys, key_offsets, kinds, starts, ends, ints, r, stack):
    """One record -> 0 (accepted, spans and values written in row ``r``) or 1 (refer)."""
    i = _ws(data, i, end)
    if i >= end or data[i] != _LBRACE:
        return 1
    i = _ws(data, i + 1, end)
    if i < end and data[i] == _RBRACE:
        return 0 if _ws(data, i + 1, end) == end else 1
    while True:
        if i >= end or data[i] != _QUOTE:
            return 1
        ks = i + 1
        ke, escaped = _string(data, ks, end)
        if ke < 0 or escaped:
            return 1
        i = _ws(data, ke + 1, end)
        if i >= end or data[i] != _COLON:
            return 1
        i = _ws(data, i + 1, end)
        if i >= end:
            return 1
        k = _key_index(data, ks, ke, keys, key_offsets)
        if k < 0:  # skipped, but validated: scalars here, containers in _skip
            c = data[i]
            if c == _QUOTE:
                i, _ = _string(data, i + 1, end)
                if i < 0:
                    return 1
                i += 1
            elif c == _MINUS or _ZERO <= c <= _NINE:
                i, _ = _number(data, i, end)
            else:
                i = _skip(data, i, end, stack)
            if i < 0:
                return 1
        else:
            if starts[r, k] != -1:  # a declared key twice
                return 1
            c = data[i]
            kind = kinds[k]
            if c == 110:  # null
                i, v = _literal(data, i, end)
                if i < 0:
                    return 1
                starts[r, k] = -2
            elif kind == STRING:
                if c != _QUOTE:
                    return 1
                e, escaped = _string(data, i + 1, end)
                if e < 0 or escaped:
                    return 1
                starts[r, k] = i + 1
                ends[r, k] = e
                i = e + 1
            elif kind == BOOLEAN:
                i, v = _literal(data, i, end)
                if i < 0:
                    return 1
                starts[r, k] = i
                ints[r, k] = v
            elif kind == INTEGER:
                e, integer = _number(data, i, end)
                if e < 0 or integer == 0:
                    return 1
                negative = c == _MINUS
                j = i + 1 if negative else i
                if negative and e - j == 1 and data[j] == _ZERO:  # -0
                    return 1
                v = 0
                while j < e:
                    d = data[j] - _ZERO
                    if v > _INT64_MAX_DIV10 or (v == _INT64_MAX_DIV10 and d > _INT64_MAX_LAST):
                        return 1  # beyond int64 (-2**63 itself included: rare, referred)
                    v = v * 10 + d
                    j += 1
                starts[r, k] = i
                ints[r, k] = -v if negative else v
                i = e
            else:  # NUMBER: its text, converted in bulk afterwards
                e, _ = _number(data, i, end)
                if e < 0:
                    return 1
                starts[r, k] = i
                ends[r, k] = e
                i = e
        i = _ws(data, i, end)
        if i >= end:
            return 1
        if data[i] == _COMMA:
            i = _ws(data, i + 1, end)
            continue
        if data[i] == _RBRACE:
            return 0 if _ws(data, i + 1, end) == end else 1
        return 1


@njit(cache=True, nogil=True, inline="always")
def copy_bytes(src, start, length, dst, at):
    """``dst[at:at + length] = src[start:start + length]``. Unsigned indices spare numba's
    negative-index handling, which otherwise keeps LLVM from vectorising the copy (7x)."""
    s, d = uint64(start), uint64(at)
    for b in range(uint64(length)):
        dst[d + b] = src[s + b]


_CHUNK = 512  # records scanned before their declared strings are copied out (still in cache)


@njit(cache=True, nogil=True)
def scan(data, offsets, keys, key_offsets, kinds, starts, ends, ints, status, gathered, out, out_offsets):
    """Every record ``r`` (bytes ``data[offsets[r]:offsets[r + 1]]``): ``status[r]`` 0 when
    accepted, else 1; for accepted records, per declared key ``k``: ``starts[r, k]`` -1 when
    absent, -2 when null, else the value's first byte (strings: after the quote);
    ``ends[r, k]`` the end of a string's or number's text; ``ints[r, k]`` an integer's or
    boolean's value. ``starts`` must arrive filled with -1.

    The text of the fields ``gathered[g]`` (strings, numbers) of accepted records is
    copied to ``out[g]`` (Arrow string layout, offsets in ``out_offsets[g]``; referred
    and absent values empty), a chunk of records at a time while their bytes are
    still in cache. Returns the number of referred records."""
    stack = np.empty(MAX_DEPTH, dtype=np.uint8)
    n = len(offsets) - 1
    referred = 0
    pos = np.zeros(len(gathered), dtype=np.int64)
    for g in range(len(gathered)):
        out_offsets[g, 0] = 0
    for c0 in range(0, n, _CHUNK):
        c1 = min(n, c0 + _CHUNK)
        for r in range(c0, c1):
            s = _record(data, offsets[r], offsets[r + 1], keys, key_offsets, kinds, starts, ends, ints, r, stack)
            status[r] = s
            referred += s
        for g in range(len(gathered)):
            f = gathered[g]
            p = pos[g]
            row = out[g]
            for r in range(c0, c1):
                a = starts[r, f]
                if a >= 0 and status[r] == 0:
                    copy_bytes(data, a, ends[r, f] - a, row, p)
                    p += ends[r, f] - a
                out_offsets[g, r + 1] = p
            pos[g] = p
    return referred
