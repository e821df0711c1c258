"""Two unrelated pipelines in one job: a window over meter readings, and beside it a stateless
feed of tariff changes decoded into two sinks (its bad records into a third).

The pipelines share no step, yet they run as one job — one Spark streaming query, so one
checkpoint, one savepoint and one exactly-once commit cover both, as one Flink job graph would.
The stateless one runs *beside* the window (docs/windows.md, "Unrelated pipelines in one job");
two pipelines that both hold state are refused (one Spark query has one watermark).

    python examples/two_pipelines.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from datetime import timedelta

from ember import Agg, CollectSink, OutputTag, ScriptedSource, StreamEnvironment, TumblingEventTimeWindows, WatermarkStrategy

READINGS = [  # (event time ms, meter, kWh used), in micro-batches
    [(1_000, "m-1", 3), (1_500, "m-2", 1), (2_200, "m-1", 2)],
    [(4_100, "m-2", 4), (3_900, "m-1", 1), (6_000, "m-1", 5)],
    [(8_300, "m-2", 2), (11_000, "m-1", 1)],
]
TARIFFS = [  # (id, JSON body) — another feed, unrelated to the readings
    [(1, '{"zone": "north", "cents": 31}'), (2, '{"zone": "south", "cents": 28}')],
    [(3, "cents=30"), (4, '{"zone": "north", "cents": 0}')],
    [(5, '{"zone": "east", "cents": 27}')],
]
WINDOW_MS = 5_000


def run() -> dict[str, CollectSink]:
    root = tempfile.mkdtemp(prefix="ember-two-pipelines-")
    sinks = {name: CollectSink() for name in ("usage", "tariffs", "zones", "bad")}
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
        # The first pipeline: kWh per meter per 5 s of event time.
        (env.from_source(ScriptedSource(READINGS, "ts bigint, meter string, kwh int"),
                         WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"), name="readings")
            .key_by("meter").window(TumblingEventTimeWindows.of(WINDOW_MS))
            .aggregate(kwh=Agg.sum("kwh"), name="usage-per-window").sink_to(sinks["usage"], name="usage"))
        # The second, unrelated: tariff changes decoded; priced ones to two sinks, bad ones to a third.
        bad = OutputTag("bad_tariffs")
        decoded = (env.from_source(ScriptedSource(TARIFFS, "id bigint, body string"), name="tariffs")
                   .parse_json("body", "zone string, cents int", dead_letter=bad, name="decode"))
        priced = decoded.filter("cents > 0", name="priced")
        priced.select("id", "zone", "cents").sink_to(sinks["tariffs"], name="tariff-table")
        priced.select("zone").sink_to(sinks["zones"], name="zones-changed")
        decoded.get_side_output(bad).sink_to(sinks["bad"], name="bad-tariffs")
        env.execute("two-pipelines", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return sinks


def expected() -> dict[str, list]:
    """What each sink gets, computed in plain Python."""
    usage: dict[tuple[str, int], int] = {}
    for batch in READINGS:
        for ts, meter, kwh in batch:
            start = ts // WINDOW_MS * WINDOW_MS
            usage[(meter, start)] = usage.get((meter, start), 0) + kwh
    tariffs, bad = [], []
    for batch in TARIFFS:
        for id_, body in batch:
            try:
                doc = json.loads(body)
            except ValueError:
                bad.append(body)
                continue
            if doc["cents"] > 0:
                tariffs.append((id_, doc["zone"], doc["cents"]))
    return {"usage": sorted((m, s, k) for (m, s), k in usage.items()), "tariffs": sorted(tariffs),
            "zones": sorted(z for _, z, _ in tariffs), "bad": sorted(bad)}


def got(sinks: dict[str, CollectSink]) -> dict[str, list]:
    return {"usage": sorted((r["meter"], r["window_start"], r["kwh"]) for r in sinks["usage"].rows()),
            "tariffs": sorted((r["id"], r["zone"], r["cents"]) for r in sinks["tariffs"].rows()),
            "zones": sorted(r["zone"] for r in sinks["zones"].rows()),
            "bad": sorted(r["raw"] for r in sinks["bad"].rows())}


def main() -> int:
    sinks = run()
    out = got(sinks)
    print("kWh per meter per 5 s window:")
    for meter, start, kwh in out["usage"]:
        print(f"  {meter} [{start:>6}, {start + WINDOW_MS:>6}) ms: {kwh} kWh")
    print("tariffs (the unrelated pipeline):", ", ".join(f"{z} {c} c" for _, z, c in out["tariffs"]))
    for r in sinks["bad"].rows():
        print(f"  dead letter {r['raw']!r}: {r['error']}")
    same = out == expected()
    print("every sink as computed in plain Python:", "yes" if same else "NO")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
