"""The events every system of ``ember bench peers`` reads, and what each job must output.

Plain Python (no imports beyond the standard library): the peer programs run this file in
their own virtualenvs, beside themselves, and Ember's side imports it as a module.

Event ``i`` (``i = 0 .. events - 1``): key ``i % keys``, event time ``i * 1000 // per_second``
ms (``per_second`` events per second of event time). Paced runs emit event ``i`` at
``start + i / per_second`` seconds of wall time, so event time and wall time advance together
and a result's latency is its wall time minus the wall time its data was due.
"""

from __future__ import annotations

WINDOW_MS = 1_000


def key_of(i: int, keys: int) -> int:
    return i % keys


def time_of(i: int, per_second: int) -> int:
    return i * 1000 // per_second


def expected_final_counts(events: int, keys: int) -> dict[int, int]:
    """Each key's count after all events."""
    return {k: events // keys + (1 if k < events % keys else 0) for k in range(min(keys, events))}


def running_count_checksum(events: int, keys: int) -> tuple[int, int]:
    """``(outputs, sum of outputs)`` of a running count emitting once per event: key ``k``
    with ``c`` events emits 1, 2, .., c."""
    return events, sum(c * (c + 1) // 2 for c in expected_final_counts(events, keys).values())


def event_index(key: int, count: int, keys: int) -> int:
    """The event that made key ``key``'s running count reach ``count``."""
    return (count - 1) * keys + key


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max of ``values`` (nearest rank), ms rounded to 0.1."""
    if not values:
        return {}
    s = sorted(values)

    def rank(q: float) -> float:
        return round(s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))], 1)

    return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": round(s[-1], 1), "samples": len(s)}
