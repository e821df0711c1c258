"""Which pages led to a purchase: a session window join (Flink's ``a.join(b).where(k)
.equal_to(k).window(EventTimeSessionWindows.with_gap(...))``) of page views and purchases
per user, with a 30 s gap of inactivity closing a session.

Sessions merge over both streams: ann's purchase at 70 s is 45 s after her last page view
(25 s), yet her view of "cart" at 50 s links the two into one session, so the purchase joins
all three views. bob's second view at 200 s starts a new session, with no purchase in it:
the left outer join reports it with no item. eve's view at 10 s arrives after the watermark
passed it, touching no open session: late, dropped and counted.

    python examples/shopping_sessions.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from datetime import timedelta

from ember import CollectSink, EventTimeSessionWindows, ScriptedSource, StreamEnvironment, WatermarkStrategy

# (event time ms, user, page), in micro-batches.
VIEWS = [
    [(0, "ann", "home"), (5_000, "bob", "home"), (25_000, "ann", "shoes")],
    [(20_000, "bob", "tv")],
    [(50_000, "ann", "cart"), (200_000, "bob", "radio")],
    [(10_000, "eve", "home")],  # behind the watermark, no open session of eve's: late
]
# (event time ms, user, item)
PURCHASES = [
    [],
    [(40_000, "bob", "tv")],
    [(70_000, "ann", "shoes")],
    [(300_000, "cid", "socks")],
]
VIEW_SCHEMA = "ts bigint, user string, page string"
PURCHASE_SCHEMA = "ts bigint, user string, item string"
GAP = timedelta(seconds=30)


def pair(view: dict | None, purchase: dict | None) -> dict:
    """One row per page view of a session: what was bought in it, if anything."""
    assert view is not None  # a left outer join: every row has its view
    return {"user": view["user"], "page": view["page"], "viewed_at": view["ts"],
            "bought": None if purchase is None else purchase["item"]}


def run() -> dict:
    root = tempfile.mkdtemp(prefix="ember-sessions-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
        bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5), "ts")
        views = env.from_source(ScriptedSource(VIEWS, VIEW_SCHEMA), bound, name="views")
        purchases = env.from_source(ScriptedSource(PURCHASES, PURCHASE_SCHEMA), bound, name="purchases")
        sink = CollectSink()
        (views.join(purchases, how="left_outer", name="sessions").where("user").equal_to("user")
         .window(EventTimeSessionWindows.with_gap(GAP))
         .apply(pair, "user string, page string, viewed_at bigint, bought string")
         .sink_to(sink))
        result = env.execute("shopping-sessions", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"rows": sink, "late": result.late_dropped}


def main() -> int:
    result = run()
    print("page views per session and what the session bought (session window join, gap 30 s):")
    for b in result["rows"].batches:
        for r in sorted(b.rows, key=lambda r: (r["user"], r["viewed_at"])):
            what = "nothing bought" if r["bought"] is None else f"bought {r['bought']}"
            print(f"  batch {b.batch_id}: {r['user']:3} viewed {r['page']:5} at {r['viewed_at'] // 1000:>3} s: {what}")
    print(f"late page views dropped (counted, as Flink drops them): {result['late']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
