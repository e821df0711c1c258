"""Window functions the event-time tests share (shipped to Spark's workers by value)."""

from __future__ import annotations

from ember import AggregateFunction


class CountSum(AggregateFunction):
    """count and sum of ``v`` in Python: a window on Ember's operator instead of Spark's native path."""

    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + 1, acc[1] + value["v"])

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])

    def get_result(self, acc):
        return {"n": acc[0], "total": acc[1]}
