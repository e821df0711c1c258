"""Shared test fixtures: one SparkSession per pytest worker (`make test` runs two) for every integration test."""

from __future__ import annotations

import os
import sys

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark():
    """The local SparkSession of this pytest worker (local[2], Ember's defaults)."""
    from ember import StreamEnvironment

    env = StreamEnvironment(master="local[2]", parallelism=2)
    session = env.spark
    yield session
    session.stop()


@pytest.fixture
def env(spark, tmp_path):
    """A fresh environment on the shared session, with its own checkpoint root (its keyed
    state layout: ``$EMBER_TEST_STATE_LAYOUT``, default blob — ``EMBER_TEST_STATE_LAYOUT=delta``
    runs the suite's jobs on the delta layout; its state buckets: ``$EMBER_TEST_MAX_PARALLELISM``,
    default unset: 128)."""
    import os

    from ember import StreamEnvironment

    return StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path / "ckpt", parallelism=2, spark=spark,
                             state_layout=os.environ.get("EMBER_TEST_STATE_LAYOUT", "blob"),
                             max_parallelism=int(os.environ.get("EMBER_TEST_MAX_PARALLELISM", "0")) or None)
