"""Declarations validate when defined, with messages that name the bad value."""

from datetime import timedelta

import pytest

from ember import (
    Agg,
    ConfigError,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WatermarkStrategy,
)
from ember.time import ManualClock, TimeCharacteristic, to_ms
from ember.windowing.assigners import SessionWindows, SlidingWindows, TumblingWindows


def test_to_ms_accepts_timedelta_and_int():
    assert to_ms(timedelta(seconds=10), "size") == 10_000
    assert to_ms(250, "size") == 250
    assert to_ms(0, "delay", allow_zero=True) == 0


@pytest.mark.parametrize("bad", [0, -5, 1.5, "10s", None, True, timedelta(microseconds=500)])
def test_to_ms_rejects_bad_values(bad):
    with pytest.raises(ConfigError, match="size"):
        to_ms(bad, "size")


def test_tumbling_and_sliding_windows():
    w = TumblingEventTimeWindows.of(timedelta(seconds=10))
    assert isinstance(w, TumblingWindows) and w.size_ms == 10_000 and not w.processing_time
    s = SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5))
    assert isinstance(s, SlidingWindows) and (s.size_ms, s.slide_ms) == (10_000, 5_000)
    assert TumblingProcessingTimeWindows.of(1000).processing_time
    g = EventTimeSessionWindows.with_gap(timedelta(minutes=1))
    assert isinstance(g, SessionWindows) and g.gap_ms == 60_000


def test_window_validation_messages():
    with pytest.raises(ConfigError, match=r"slide \(20000 ms\) must not exceed the window size \(10000 ms\)"):
        SlidingEventTimeWindows.of(10_000, 20_000)
    with pytest.raises(ConfigError, match="offset"):
        TumblingEventTimeWindows.of(1000, offset=1000)
    with pytest.raises(ConfigError, match="session gap"):
        EventTimeSessionWindows.with_gap(0)


def test_aggregates():
    assert Agg.count().default_name() == "count"
    assert Agg.sum("price").describe() == "sum(price)"
    with pytest.raises(ConfigError, match="needs a field"):
        Agg.sum("")
    with pytest.raises(ConfigError, match="unknown aggregate"):
        from ember.windowing.aggregates import Aggregate

        Aggregate("median", "x")


def test_watermark_strategies():
    w = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2), "ts")
    assert (w.characteristic, w.timestamp_field, w.max_out_of_orderness_ms) == (TimeCharacteristic.EVENT_TIME, "ts", 2000)
    assert WatermarkStrategy.for_monotonous_timestamps("ts").max_out_of_orderness_ms == 0
    assert WatermarkStrategy.ingestion_time().characteristic is TimeCharacteristic.INGESTION_TIME
    assert WatermarkStrategy.processing_time().characteristic is TimeCharacteristic.PROCESSING_TIME
    with pytest.raises(ConfigError, match="timestamp_field"):
        WatermarkStrategy.for_bounded_out_of_orderness(1000, "")


def test_manual_clock():
    c = ManualClock(1000)
    c.advance(500)
    assert c.now_ms() == 1500


def test_state_descriptors_validate():
    from ember.functions import AggregateFunction
    from ember.state import (
        AggregatingStateDescriptor,
        ReducingStateDescriptor,
        StateTtlConfig,
        ValueStateDescriptor,
    )

    assert StateTtlConfig.of(timedelta(minutes=1)).ttl_ms == 60_000
    with pytest.raises(ConfigError, match="update_on must be one of"):
        StateTtlConfig.of(1000, update_on="never")
    with pytest.raises(ConfigError, match="state name must be a non-empty string"):
        ValueStateDescriptor("")
    with pytest.raises(ConfigError, match="reduce_fn must be callable"):
        ReducingStateDescriptor("r")
    with pytest.raises(ConfigError, match="aggregate_fn must be an AggregateFunction"):
        AggregatingStateDescriptor("a", aggregate_fn=sum)
    assert AggregatingStateDescriptor("a", aggregate_fn=AggregateFunction()).name == "a"
    with pytest.raises(ConfigError, match="ttl must be a StateTtlConfig"):
        ValueStateDescriptor("v", ttl=1000)


def test_driver_side_sinks_forget_uncommitted_batches():
    from ember import CollectSink, CountSink

    collect, count = CollectSink(), CountSink(latency_field="ts")
    for b in range(4):
        collect.accept_batch(b, 0, [{"b": b}])
        count.accept_batch(b, 10, [b])
    collect.forget_after(1)
    count.forget_after(1)
    assert collect.rows() == [{"b": 0}, {"b": 1}]
    assert count.count == 20 and count.latencies_ms == [0, 1]


def test_a_connector_whose_optional_client_is_missing_fails_when_declared(monkeypatch):
    import importlib.util

    from ember import PostgresSink, RedisStreamSink

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("redis", "psycopg") else real(name, *a))
    with pytest.raises(ConfigError, match=r"RedisStreamSink needs the 'redis' package.*pip install 'ember-stream\[redis\]'"):
        RedisStreamSink("alerts")
    with pytest.raises(ConfigError, match=r"PostgresSink needs the 'psycopg' package.*ember-stream\[postgres\]"):
        PostgresSink("alerts")
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert RedisStreamSink("alerts").stream == "alerts"  # installed here: declared fine


def test_run_time_limits_take_a_timedelta_or_seconds_by_name():
    from ember.time.durations import seconds_of

    assert seconds_of(timedelta(milliseconds=1500), None, "duration") == 1.5
    assert seconds_of(None, 2, "duration") == 2.0
    assert seconds_of(None, None, "duration") is None
    with pytest.warns(DeprecationWarning, match=r"duration=3: a bare number here is seconds.*duration_s=3"):
        assert seconds_of(3, None, "duration") == 3.0  # the old spelling still means seconds
    with pytest.raises(ConfigError, match="give duration .* or duration_s .*, not both"):
        seconds_of(timedelta(seconds=1), 1, "duration")
    with pytest.raises(ConfigError, match="stop_when_idle_s must be a positive number of seconds, got 0"):
        seconds_of(None, 0, "stop_when_idle")
    with pytest.raises(ConfigError, match="duration must be a timedelta, got '10s'"):
        seconds_of("10s", None, "duration")


def test_the_window_building_blocks_the_readme_lists_are_importable_from_ember():
    import ember

    for name in ("EventTimeTrigger", "ProcessingTimeTrigger", "CountTrigger", "PurgingTrigger",
                 "ContinuousEventTimeTrigger", "ContinuousProcessingTimeTrigger", "Trigger", "TriggerResult",
                 "CountEvictor", "TimeEvictor", "DeltaEvictor"):
        assert name in ember.__all__ and getattr(ember, name).__module__.startswith("ember.windowing.")


def test_max_parallelism_from_the_command_line():
    from ember.cli.main import _env_from, _parser

    args = _parser().parse_args(["run", "job.py", "--max-parallelism", "16", "--parallelism", "2"])
    assert (_env_from(args).config.max_parallelism, _env_from(args).config.parallelism) == (16, 2)
    assert _env_from(_parser().parse_args(["run", "job.py"])).config.max_parallelism == 128
    with pytest.raises(ConfigError, match="parallelism 4 is above max_parallelism 2"):
        _env_from(_parser().parse_args(["run", "job.py", "--max-parallelism", "2", "--parallelism", "4"]))
