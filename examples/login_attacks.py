"""Complex event processing (docs/cep.md): a login followed by three failed attempts in a
row and no successful one within a minute — per user, in event time, on Ember's keyed state.

Events arrive out of order (up to 2 s); the pattern's partial matches live in keyed state,
and a match is emitted once the watermark shows that no "ok" came in time. Logins whose
attempts did not finish within the minute go to a side output (timed-out partial matches).
At the end every alert is checked against a plain-Python scan of the same events.

    python examples/login_attacks.py [--users 400]
    ember run examples/login_attacks.py:build
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from datetime import timedelta

from ember import CollectSink, OutputTag, ScriptedSource, StreamEnvironment, WatermarkStrategy
from ember.cep import CEP, Pattern, PatternProcessFunction

MINUTE = 60_000
SCHEMA = "ts bigint, user string, type string"
ALERTS = "user string, login_at bigint, last_fail_at bigint"
SLOW = OutputTag("slow", "user string, login_at bigint, fails int")


def attacks() -> Pattern:
    return (
        Pattern.begin("login").where(lambda e: e["type"] == "login")
        .followed_by("fail").where("type = 'fail'").times(3).consecutive()  # a SQL condition: evaluated by Spark
        .not_followed_by("ok").where(lambda e: e["type"] == "ok")
        .within(timedelta(minutes=1))
    )


class Alert(PatternProcessFunction):
    def process_match(self, match, ctx):
        login, fails = match["login"][0], match["fail"]
        yield {"user": login["user"], "login_at": login["ts"], "last_fail_at": fails[-1]["ts"]}

    def process_timed_out_match(self, match, ctx):
        login = match["login"][0]
        yield {"user": login["user"], "login_at": login["ts"], "fails": len(match.get("fail", []))}


def sessions(users: int, seed: int = 7) -> list[tuple[int, str, str]]:
    """One login per user, then attempts: some users fail three times and stop, some
    recover, some are slow. Timestamps distinct per user."""
    rng = random.Random(seed)
    events = []
    for u in range(users):
        user, t = f"user{u:04d}", rng.randint(0, 30_000)
        events.append((t, user, "login"))
        for _ in range(rng.randint(1, 6)):
            t += rng.choice((1_000, 5_000, 15_000, 25_000))
            events.append((t, user, rng.choice(("fail", "fail", "fail", "ok"))))
    return events


def batches_of(events: list[tuple[int, str, str]], per_batch: int = 500, jitter_ms: int = 2_000, seed: int = 3) -> list[list[tuple]]:
    """In time order, each event shifted by up to ``jitter_ms`` in arrival (out of order within the bound)."""
    rng = random.Random(seed)
    arrival = sorted(events, key=lambda e: e[0] + rng.randint(0, jitter_ms))
    return [arrival[i:i + per_batch] for i in range(0, len(arrival), per_batch)]


def expected_alerts(events: list[tuple[int, str, str]]) -> list[tuple[str, int, int]]:
    """The pattern by hand, per user: the login, then the first fail after it and the next two
    events both fails, then no ok before the login's minute is over."""
    per_user: dict[str, list[tuple[int, str]]] = {}
    for ts, user, kind in events:
        per_user.setdefault(user, []).append((ts, kind))
    out = []
    for user, evs in per_user.items():
        evs.sort()
        for i, (login_at, kind) in enumerate(evs):
            if kind != "login":
                continue
            first = next((j for j in range(i + 1, len(evs)) if evs[j][1] == "fail"), None)
            if first is None or first + 2 >= len(evs) or any(evs[j][1] != "fail" for j in (first + 1, first + 2)):
                continue
            last = evs[first + 2][0]
            if last - login_at >= MINUTE:
                continue
            if any(kind2 == "ok" and ts < login_at + MINUTE for ts, kind2 in evs[first + 3:]):
                continue
            out.append((user, login_at, last))
    return sorted(out)


def build(env: StreamEnvironment, users: int = 400) -> tuple[CollectSink, CollectSink, list]:
    events = sessions(users)
    alerts, slow = CollectSink(), CollectSink()
    logins = env.from_source(
        ScriptedSource(batches_of(events), SCHEMA),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2), "ts"), name="logins",
    )
    matched = CEP.pattern(logins.key_by("user"), attacks()).process(Alert(), ALERTS, timed_out=SLOW, name="attacks")
    matched.sink_to(alerts, name="alerts")
    matched.get_side_output(SLOW).sink_to(slow, name="slow-logins")
    return alerts, slow, events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=400)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)
    checkpoint = tempfile.mkdtemp(prefix="ember-cep-")
    try:
        env = StreamEnvironment(master=args.master, checkpoint_dir=checkpoint)
        alerts, slow, events = build(env, args.users)
        result = env.execute("login-attacks", progress=False)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    got = sorted((r["user"], r["login_at"], r["last_fail_at"]) for r in alerts.rows())
    want = expected_alerts(events)
    print(f"{len(events):,} login events of {args.users} users in {result.batches} micro-batches")
    print(f"alerts (login, 3 fails in a row, no ok within a minute): {len(got)}; expected by a plain scan: {len(want)}")
    print(f"logins timed out before the pattern completed: {len(slow.rows())}")
    for user, login_at, last in got[:3]:
        print(f"  {user}: login at {login_at} ms, third failure at {last} ms")
    ok = got == want and len(want) > 0
    print("check:", "every alert exact" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
