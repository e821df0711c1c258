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
    from ember.runner.spark.session import ADAPTIVE, CHECKPOINT_FILES, FILESYSTEM_CHECKPOINT_FILES, query_settings

    for path in ("/tmp/ckpt", "file:///tmp/ckpt"):
        assert query_settings(path, {}) == {CHECKPOINT_FILES: FILESYSTEM_CHECKPOINT_FILES, ADAPTIVE: "false"}
    assert query_settings("hdfs://nn/ckpt", {}) == {ADAPTIVE: "false"}  # other file systems: Spark's manager
    assert query_settings("s3a://bucket/ckpt", {ADAPTIVE: "true"}) == {}  # the user's settings win
    assert query_settings("/tmp/ckpt", {CHECKPOINT_FILES: "x"}) == {ADAPTIVE: "false"}


def test_settings_hold_while_the_query_runs_and_the_sessions_own_come_back():
    from ember.runner.spark.session import session_settings

    spark = _Spark(**{"a": "mine"})
    with session_settings(spark, {"a": "ember", "b": "ember"}):
        assert spark.conf.values == {"a": "ember", "b": "ember"}
    assert spark.conf.values == {"a": "mine"}  # restored, and b unset again
