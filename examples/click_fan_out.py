"""A fan-out: one stateful step read by several — Flink's DAG of stateful operators, on Spark.

Clicks arrive with duplicates (a client re-sends). Every click as sent goes to an audit sink,
and one ``process`` step drops the duplicates; its output then feeds three readers at once:

- clicks per campaign per 2 s of event time (a window keyed by campaign) — each click first
  looked up in the campaign table on that branch alone, a click of an unknown campaign going to
  a dead-letter sink — whose results a further process function reads: a campaign with 3 or
  more clicks in a window is hot,
- a running count per user that flags the user at 3 clicks (a process function keyed by
  user, with a side output of flagged users),
- every deduplicated click, to a sink.

The stream parts at the source (the audit sink and the dedupe), so the dedupe runs as a lane
of one Spark operator with the raw clicks passing it, its readers as lanes of a second, the
hot-campaign check as a third level (docs/design/dataflow.md, "Fan-out"): one query, one
checkpoint, each step with its own key, state and event time.

    python examples/click_fan_out.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from datetime import timedelta

from ember import (
    CollectSink,
    KeyedProcessFunction,
    OutputTag,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.state.descriptors import ValueStateDescriptor

SCHEMA = "ts bigint, user string, campaign string, click_id bigint"
# (event time ms, user, campaign, click id) in four micro-batches; click ids 3 and 6 are sent twice;
# "socks" is no campaign of CAMPAIGNS.
BATCHES = [
    [(1_000, "ann", "shoes", 1), (1_200, "bob", "shoes", 2), (1_500, "ann", "hats", 3)],
    [(1_500, "ann", "hats", 3), (2_100, "cid", "hats", 4), (2_200, "dee", "socks", 10), (2_600, "ann", "shoes", 5)],
    [(3_100, "bob", "hats", 6), (3_100, "bob", "hats", 6), (3_900, "ann", "hats", 7)],
    [(6_000, "bob", "shoes", 8), (6_500, "bob", "shoes", 9)],
]
FLAGGED = OutputTag("flagged", "user string, clicks bigint")
CAMPAIGNS = [{"campaign": "shoes", "advertiser": "acme"}, {"campaign": "hats", "advertiser": "capco"}]
UNKNOWN = OutputTag("unknown_campaign")  # dead letters: raw (the click as JSON) and error


class Dedupe(KeyedProcessFunction):
    """Forwards the first click of each click id."""

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen"))

    def process_element(self, click, ctx):
        if self.seen.value() is None:
            self.seen.update(True)
            yield click


class ClicksPerUser(KeyedProcessFunction):
    """The user's running click count; at the third click the user is flagged (side output)."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("clicks", default=0))

    def process_element(self, click, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        if n == 3:
            ctx.output(FLAGGED, {"user": click["user"], "clicks": n})
        yield {"user": click["user"], "clicks": n}


class HotCampaigns(KeyedProcessFunction):
    """A window result with 3 clicks or more: the campaign is hot in that window."""

    def process_element(self, counted, ctx):
        if counted["count"] >= 3:
            yield {"campaign": counted["campaign"], "window_start": counted["window_start"], "clicks": counted["count"]}


def run() -> dict[str, CollectSink]:
    root = tempfile.mkdtemp(prefix="ember-fan-out-")
    names = ("received", "per_campaign", "unknown", "hot", "per_user", "flagged", "clicks")
    sinks = {name: CollectSink() for name in names}
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
        clicks = env.from_source(
            ScriptedSource(BATCHES, SCHEMA),
            WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=500), "ts"), name="clicks")
        clicks.sink_to(sinks["received"], name="audit")  # every click as sent, duplicates too
        unique = clicks.key_by("click_id").process(Dedupe(), SCHEMA, name="dedupe")
        known = unique.join_lookup(CAMPAIGNS, "campaign", unmatched=UNKNOWN, name="campaign-lookup")
        known.get_side_output(UNKNOWN).sink_to(sinks["unknown"], name="unknown-campaigns")
        per_campaign = known.key_by("campaign").window(TumblingEventTimeWindows.of(2_000)).count(name="clicks-per-campaign")
        per_campaign.sink_to(sinks["per_campaign"], name="per-campaign")
        (per_campaign.key_by("campaign").process(HotCampaigns(), "campaign string, window_start bigint, clicks bigint",
                                                 name="hot-campaigns").sink_to(sinks["hot"], name="hot"))
        per_user = unique.key_by("user").process(ClicksPerUser(), "user string, clicks bigint", name="clicks-per-user")
        per_user.sink_to(sinks["per_user"], name="per-user")
        per_user.get_side_output(FLAGGED).sink_to(sinks["flagged"], name="flagged-users")
        unique.sink_to(sinks["clicks"], name="unique-clicks")
        print(env.explain().split("\n== Spark plan")[0])
        env.execute("click-fan-out", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return sinks


def main() -> int:
    sinks = run()
    print("\nclicks per campaign per 2 s window:")
    for r in sorted(sinks["per_campaign"].rows(), key=lambda r: (r["window_start"], r["campaign"])):
        print(f"  [{r['window_start']:>5}, {r['window_end']:>5}) {r['campaign']:5} {r['count']}")
    print("clicks of unknown campaigns:", "; ".join(r["raw"] for r in sinks["unknown"].rows()) or "none")
    hot = sorted((r["window_start"], r["campaign"], r["clicks"]) for r in sinks["hot"].rows())
    print("hot campaigns (3+ clicks in a window):", ", ".join(f"{c} from {w} ({n})" for w, c, n in hot) or "none")
    counts = {}
    for r in sinks["per_user"].rows():
        counts[r["user"]] = max(counts.get(r["user"], 0), r["clicks"])
    print("clicks per user:", ", ".join(f"{u} {n}" for u, n in sorted(counts.items())))
    print("flagged at 3 clicks:", ", ".join(sorted(r["user"] for r in sinks["flagged"].rows())) or "nobody")
    print("unique clicks:", len(sinks["clicks"].rows()), "of", len(sinks["received"].rows()), "received (audit sink),",
          sum(len(b) for b in BATCHES), "sent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
