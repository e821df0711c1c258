"""Small statistics helpers for benchmarks and summaries."""

from __future__ import annotations

import statistics
from typing import Iterable

__all__ = ["percentiles", "median"]


def percentiles(values: Iterable[float], points: tuple[int, ...] = (50, 90, 95, 99)) -> dict[str, float] | None:
    """Nearest-rank percentiles ``{"p50": ..}`` of ``values``; None when empty."""
    data = sorted(values)
    if not data:
        return None
    out = {}
    for p in points:
        rank = max(1, -(-p * len(data) // 100))  # ceil(p/100 * n), nearest-rank method
        out[f"p{p}"] = float(data[rank - 1])
    return out


def median(values: Iterable[float]) -> float:
    data = list(values)
    return float(statistics.median(data)) if data else 0.0
