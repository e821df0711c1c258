"""Session settings Ember applies to the SparkSessions it creates (no session started)."""

import sys

from ember.job import EnvironmentConfig


def test_sessions_run_python_workers_on_this_interpreter():
    from ember.runner.spark.session import session_defaults

    conf = session_defaults(EnvironmentConfig())
    assert conf["spark.pyspark.python"] == sys.executable == conf["spark.executorEnv.PYSPARK_PYTHON"]


class _Conf:
    """The part of ``spark.conf`` the settings use, recording what happens."""

    def __init__(self, **values):
        self.values = dict(values)

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value

    def unset(self, key):
        self.values.pop(key, None)


class _Spark:
    def __init__(self, **values):
        self.conf = _Conf(**values)


def test_a_local_checkpoint_is_written_through_the_file_system_api_and_sinks_run_without_aqe():
    from ember.runner.spark.session import (
        ADAPTIVE,
        ARROW_BATCH_BYTES,
        CHECKPOINT_FILES,
        FILESYSTEM_CHECKPOINT_FILES,
        UNBOUNDED_BYTES,
        query_settings,
    )

    rows_only = {ARROW_BATCH_BYTES: UNBOUNDED_BYTES}
    for path in ("/tmp/ckpt", "file:///tmp/ckpt"):
        assert query_settings(path, {}) == {CHECKPOINT_FILES: FILESYSTEM_CHECKPOINT_FILES, ADAPTIVE: "false", **rows_only}
    assert query_settings("hdfs://nn/ckpt", {}) == {ADAPTIVE: "false", **rows_only}  # other file systems: Spark's manager
    user = {ADAPTIVE: "true", ARROW_BATCH_BYTES: "1048576"}
    assert query_settings("s3a://bucket/ckpt", user) == {}  # the user's settings win
    assert query_settings("/tmp/ckpt", {CHECKPOINT_FILES: "x"}) == {ADAPTIVE: "false", **rows_only}


def test_a_setting_the_users_own_session_made_is_kept_and_unset_ones_are_embers():
    from ember.runner.spark.session import ADAPTIVE, ARROW_BATCH_BYTES, UNBOUNDED_BYTES, query_settings

    assert UNBOUNDED_BYTES == "2147483647"  # the one value Spark reads as "no byte bound" (no per-row size check)
    mine = _Spark(**{ARROW_BATCH_BYTES: "1048576"})
    assert query_settings("hdfs://nn/ckpt", {}, mine) == {ADAPTIVE: "false"}
    assert query_settings("hdfs://nn/ckpt", {}, _Spark()) == {ADAPTIVE: "false", ARROW_BATCH_BYTES: UNBOUNDED_BYTES}


def test_settings_hold_while_the_query_runs_and_the_sessions_own_come_back():
    from ember.runner.spark.session import session_settings

    spark = _Spark(**{"a": "mine"})
    with session_settings(spark, {"a": "ember", "b": "ember"}):
        assert spark.conf.values == {"a": "ember", "b": "ember"}
    assert spark.conf.values == {"a": "mine"}  # restored, and b unset again
