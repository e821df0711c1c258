"""Fixtures of the Spark-free unit tests: an environment that never starts Spark
(declaring and planning a pipeline needs none) and a small event-time stream."""

from __future__ import annotations

import pytest

from ember import ScriptedSource, StreamEnvironment, WatermarkStrategy


@pytest.fixture
def env(tmp_path):
    return StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path)


@pytest.fixture
def events(env):
    """``events()``: a stream 'events' of ``(ts bigint, k string)`` with event time from ``ts``."""

    def make():
        return env.from_source(
            ScriptedSource([[(1, "a")]], "ts bigint, k string"),
            WatermarkStrategy.for_bounded_out_of_orderness(0, "ts"),
            name="events",
        )

    return make
