"""Narrowing a failing vectorised call down to what it fails on (dead letters of
``map_batches`` and ``process_batches``; docs/design/dead-letters.md)."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["narrowed"]


def narrowed(call: Callable[[Any], Any], part: Any, size: Callable[[Any], int], cut: Callable[[Any, int, int], Any],
             failed: Callable[[Any, Exception], None]) -> list[Any]:
    """``[call(part)]`` — or, when it raises, the results of ``part``'s two halves
    (``cut(part, start, stop)``), each narrowed again, down to single records:
    ``failed(record, exc)`` for each record the call fails on alone. A batch with k bad
    records of n costs ~2k log2(n) calls more, nothing when none fails."""
    try:
        return [call(part)]
    except Exception as exc:  # noqa: BLE001 - narrowed down to the records that fail
        n = size(part)
        if n <= 1:
            if n == 1:
                failed(part, exc)
            return []
        mid = n // 2
        return (narrowed(call, cut(part, 0, mid), size, cut, failed)
                + narrowed(call, cut(part, mid, n), size, cut, failed))
