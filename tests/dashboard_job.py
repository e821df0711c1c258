"""A small job with every kind of step the dashboard shows: a source with event time, a
keyed process step (state), a Python map with dead letters, a split into three sinks.
Shared by the dashboard's tests and the recorder of their fixture."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ember import CountSink, KeyedProcessFunction, OutputTag, StreamEnvironment, WatermarkStrategy, YahooSource
from ember.state import ValueStateDescriptor

BAD = OutputTag("unparsable")
FAIL_EVERY = 101  # the map fails on counts that are a multiple of this


def label(record: dict[str, Any]) -> dict[str, Any]:
    if record["n"] % FAIL_EVERY == 0:
        raise ValueError(f"cannot label count {record['n']}")
    return {"event_type": record["event_type"], "n": record["n"], "label": f"{record['event_type']}#{record['n']}"}


class CountPerType(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(ValueStateDescriptor("seen", default=0))

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        n = self.seen.value() + 1
        self.seen.update(n)
        yield {"event_type": value["event_type"], "n": n}


def build(env: StreamEnvironment, rate: float = 5_000) -> dict[str, CountSink]:
    sinks = {"counts": CountSink(), "even": CountSink(), "dead": CountSink()}
    events = env.from_source(
        YahooSource(rate=rate, partitions=1, skew_ms=0),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "event_time"), name="ad-events",
    )
    counts = events.key_by("event_type").process(CountPerType(), "event_type string, n long", name="count-per-type")
    labelled = counts.map(label, "event_type string, n long, label string", dead_letter=BAD, name="label")
    labelled.sink_to(sinks["counts"], name="counts")
    labelled.filter("n % 2 = 0", name="even-only").sink_to(sinks["even"], name="even")
    labelled.get_side_output(BAD).sink_to(sinks["dead"], name="dead-letters")
    return sinks
