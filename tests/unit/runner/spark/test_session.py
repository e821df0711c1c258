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


def test_a_local_checkpoint_is_written_through_the_file_system_api_while_the_query_runs():
    from ember.runner.spark.session import CHECKPOINT_FILES, FILESYSTEM_CHECKPOINT_FILES, checkpoint_files

    for path in ("/tmp/ckpt", "file:///tmp/ckpt"):
        spark = _Spark()
        with checkpoint_files(spark, path, {}):
            assert spark.conf.get(CHECKPOINT_FILES) == FILESYSTEM_CHECKPOINT_FILES
        assert CHECKPOINT_FILES not in spark.conf.values  # restored: other queries keep Spark's default
    spark = _Spark(**{CHECKPOINT_FILES: "mine"})
    with checkpoint_files(spark, "/tmp/ckpt", {}):
        assert spark.conf.get(CHECKPOINT_FILES) == FILESYSTEM_CHECKPOINT_FILES
    assert spark.conf.get(CHECKPOINT_FILES) == "mine"


def test_another_file_system_or_the_users_choice_keeps_sparks_manager():
    from ember.runner.spark.session import CHECKPOINT_FILES, checkpoint_files

    for path, conf in (("hdfs://nn/ckpt", {}), ("s3a://bucket/ckpt", {}), ("/tmp/ckpt", {CHECKPOINT_FILES: "x"})):
        spark = _Spark()
        with checkpoint_files(spark, path, conf):
            assert spark.conf.get(CHECKPOINT_FILES) is None
