"""Session settings Ember applies to the SparkSessions it creates (no session started)."""

import sys

from ember.job import EnvironmentConfig


def test_sessions_run_python_workers_on_this_interpreter():
    from ember.runner.spark.session import session_defaults

    conf = session_defaults(EnvironmentConfig())
    assert conf["spark.pyspark.python"] == sys.executable == conf["spark.executorEnv.PYSPARK_PYTHON"]
