"""Ad attribution with an interval join (Flink's ``KeyedStream.intervalJoin``): a click counts
for the impression of the same ad and user shown at most 10 s before it.

- ``attributed``: every (impression, click) pair, with the delay — a native projection;
- ``outcome``: every impression once its 10 s have passed, clicked or not — a left outer
  join whose pairs go to a Python function (an unmatched impression comes with ``None``).

The click at 4 s arrives one batch late, still within the out-of-orderness bound (2 s):
it is joined. The click at 500 ms arrives after the watermark passed it: it is late,
dropped and counted (``late_dropped``), as Flink drops it.

    python examples/ad_attribution.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from datetime import timedelta

from ember import CollectSink, ScriptedSource, StreamEnvironment, WatermarkStrategy

# (event time ms, user, ad), in micro-batches.
IMPRESSIONS = [
    [(1_000, "ann", "shoes"), (2_000, "bob", "tv")],
    [(9_000, "ann", "tv")],
    [(30_000, "cid", "shoes")],
    [],
]
CLICKS = [
    [(6_000, "ann", "shoes")],  # 5 s after ann saw the shoes ad
    [(4_000, "bob", "tv"), (14_000, "ann", "shoes")],  # bob: 2 s after; ann's second click: 13 s, too late for it
    [(19_500, "ann", "tv")],  # 10.5 s after ann saw the tv ad: outside the interval
    [(500, "dan", "tv")],  # behind the watermark: late
]
SCHEMA = "ts bigint, user string, ad string"
WITHIN = timedelta(seconds=10)


def outcome(impression: dict | None, click: dict | None) -> dict:
    """One row per impression: clicked after how long, or not."""
    assert impression is not None  # a left outer join: every row has its impression
    delay = None if click is None else click["ts"] - impression["ts"]
    return {"user": impression["user"], "ad": impression["ad"], "shown_at": impression["ts"], "click_delay_ms": delay}


def run() -> dict:
    root = tempfile.mkdtemp(prefix="ember-attribution-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
        bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2), "ts")
        impressions = env.from_source(ScriptedSource(IMPRESSIONS, SCHEMA), bound, name="impressions")
        clicks = env.from_source(ScriptedSource(CLICKS, SCHEMA), bound, name="clicks")

        pairs, outcomes = CollectSink(), CollectSink()
        by_user_ad = impressions.key_by("user", "ad")
        (by_user_ad.interval_join(clicks.key_by("user", "ad"), name="attributed").between(timedelta(0), WITHIN)
         .select("left.user AS user", "left.ad AS ad", "right.ts - left.ts AS delay_ms")
         .sink_to(pairs))
        first = env.execute("attribution", progress=False)

        env2 = StreamEnvironment(master="local[2]", checkpoint_dir=root + "/outcome", parallelism=2, spark=env.spark)
        impressions = env2.from_source(ScriptedSource(IMPRESSIONS, SCHEMA), bound, name="impressions")
        clicks = env2.from_source(ScriptedSource(CLICKS, SCHEMA), bound, name="clicks")
        (impressions.key_by("user", "ad").interval_join(clicks.key_by("user", "ad"), how="left_outer", name="outcome")
         .between(timedelta(0), WITHIN)
         .process(outcome, "user string, ad string, shown_at bigint, click_delay_ms bigint")
         .sink_to(outcomes))
        second = env2.execute("attribution-outcome", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"pairs": pairs, "outcomes": outcomes, "late": (first.late_dropped, second.late_dropped)}


def main() -> int:
    result = run()
    print("clicks attributed to an impression (interval join, within 10 s):")
    for b in result["pairs"].batches:
        for r in sorted(b.rows, key=lambda r: (r["user"], r["ad"])):
            print(f"  batch {b.batch_id}: {r['user']:3} {r['ad']:5} clicked {r['delay_ms']} ms after the impression")
    print("every impression's outcome (left outer join):")
    for b in result["outcomes"].batches:
        for r in sorted(b.rows, key=lambda r: r["shown_at"]):
            what = "no click within 10 s" if r["click_delay_ms"] is None else f"clicked after {r['click_delay_ms']} ms"
            print(f"  batch {b.batch_id}: {r['user']:3} {r['ad']:5} shown at {r['shown_at']:>6}: {what}")
    print(f"late clicks dropped (counted, as Flink drops them): {result['late'][0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
