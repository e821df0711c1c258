"""Checking a job's output against what a generator produced."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.connectors.generators import YahooSource

__all__ = ["WindowCheck", "check_yahoo_windows"]


@dataclass
class WindowCheck:
    """Outcome of comparing emitted window counts with the generator's ground truth."""

    windows: int = 0
    matched: int = 0
    wrong: list[tuple[Any, int, int]] = field(default_factory=list)  # (key, got, expected)
    missing: list[Any] = field(default_factory=list)  # closed windows never emitted
    duplicated: list[Any] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.windows > 0 and not self.wrong and not self.missing and not self.duplicated


def check_yahoo_windows(
    source: YahooSource,
    rows: list[dict[str, Any]],
    events: int,
    start_ms: int,
    size_ms: int,
    watermark_ms: int | None,
) -> WindowCheck:
    """Every emitted ``(campaign_id, window_start, count)`` row must equal the count
    of views the generator produced for that campaign and window among the first
    ``events`` events; every window that closed (end <= watermark) must be emitted once."""
    expected = source.expected_window_counts(0, events, start_ms, size_ms)
    check = WindowCheck()
    seen: set[tuple[str, int]] = set()
    for row in rows:
        key = (row["campaign_id"], int(row["window_start"]))
        if key in seen:
            check.duplicated.append(key)
            continue
        seen.add(key)
        check.windows += 1
        want = expected.get(key, 0)
        if int(row["count"]) == want:
            check.matched += 1
        else:
            check.wrong.append((key, int(row["count"]), want))
    if watermark_ms is not None:
        for key in expected:
            if key[1] + size_ms <= watermark_ms and key not in seen:
                check.missing.append(key)
    return check
