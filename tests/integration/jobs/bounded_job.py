"""A small job module for the CLI tests: ``build(env)`` declares the pipeline."""

from ember import Agg, CollectSink, ScriptedSource, TumblingEventTimeWindows, WatermarkStrategy

SINK = CollectSink()


def build(env):
    events = ScriptedSource([[(1_000, "a"), (2_500, "b")], [(4_000, "a")]], "ts bigint, k string")
    (
        env.from_source(events, WatermarkStrategy.for_monotonous_timestamps("ts"), name="clicks")
        .key_by("k")
        .window(TumblingEventTimeWindows.of(2_000))
        .aggregate(clicks=Agg.count())
        .sink_to(SINK)
    )
