"""Yahoo ad events as JSON texts, as a broker would carry them, counted per campaign
and 10 s event-time window — with the malformed ones kept as dead letters.

Every 5,000th event is cut short (invalid JSON). ``parse_json`` decodes the
three fields the job reads (right after the generator it runs inside the
source's reader, docs/design/json.md); its dead letters go to their own sink
while the decoded views feed the window, in one job. At the end every window
count is checked against the generator, and every malformed event must be
among the dead letters, with its reason.

    python examples/json_campaigns.py [--events 2000000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from datetime import timedelta

import pandas as pd

from ember import (
    CollectSink,
    OutputTag,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    YahooSource,
)
from ember.bench.verify import check_yahoo_windows

WINDOW = timedelta(seconds=10)
BAD_JSON = OutputTag("bad_json")


def build(env: StreamEnvironment, source: YahooSource) -> tuple[CollectSink, CollectSink]:
    """The pipeline on ``env``: (window counts, dead letters)."""
    windows, dead = CollectSink(), CollectSink()
    campaigns = pd.DataFrame(source.campaign_table(), columns=["ad_id", "campaign_id"])
    events = env.from_source(
        source, WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "event_time"), name="ad-events"
    )
    decoded = events.parse_json(
        "event", "ad_id string not null, event_type string not null, event_time string not null",
        dead_letter=BAD_JSON, name="decode",
    )
    (
        decoded.filter("event_type = 'view'", name="views")
        .select("ad_id", "CAST(event_time AS BIGINT) AS event_time", name="project")
        .join_lookup(campaigns, on="ad_id", name="campaign-lookup")
        .key_by("campaign_id")
        .window(TumblingEventTimeWindows.of(WINDOW))
        .count(name="views-per-window")
        .sink_to(windows, name="windows")
    )
    decoded.get_side_output(BAD_JSON).sink_to(dead, name="dead-letters")
    return windows, dead


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="events to generate (default 2,000,000)")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    source = YahooSource(as_json=True, partitions=2, max_events=args.events, max_events_per_batch=500_000,
                         nominal_rate=100_000, malformed_every=5_000, start_ms=1_700_000_000_000)
    checkpoint = tempfile.mkdtemp(prefix="ember-json-")
    try:
        env = StreamEnvironment(master=args.master, checkpoint_dir=checkpoint)
        windows, dead = build(env, source)
        print(env.explain(spark_plan=False), flush=True)
        result = env.execute("json-campaigns")
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)

    check = check_yahoo_windows(source, windows.rows(), result.events, source.start_ms,
                                int(WINDOW.total_seconds() * 1000), result.final_watermark_ms)
    malformed = [r["event"] for r in source.records(source.seqs(0, result.events), source.start_ms)
                 if not r["event"].endswith("}")]
    dead_rows = dead.rows()
    dead_exact = sorted(r["raw"] for r in dead_rows) == sorted(malformed)
    print()
    print("== Summary ==")
    print(f"events processed      {result.events:,} in {result.seconds:.1f} s = {result.events_per_second:,.0f} events/s")
    print(f"windows emitted       {check.windows} (campaign x 10 s window); "
          f"{check.matched}/{check.windows} counts equal the generator's, {len(check.missing)} missing")
    print(f"dead letters          {len(dead_rows):,} (malformed events generated: {len(malformed):,})")
    if dead_rows:
        print(f"  e.g. {dead_rows[0]['error']}: {dead_rows[0]['raw'][:60]}...")
    ok = check.ok and check.windows > 0 and dead_exact
    print("RESULT                " + ("EXACT" if ok else "NOT EXACT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
