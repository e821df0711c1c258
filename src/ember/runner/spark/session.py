"""Creating (or reusing) the SparkSession with Ember's defaults."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from ember.job import EnvironmentConfig
from ember.runner.spark.class_archive import java_options

__all__ = ["get_or_create_session", "session_defaults", "configure_for_query", "lateness_setting", "query_settings",
           "session_settings", "warm_up"]

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def session_defaults(config: EnvironmentConfig) -> dict[str, str]:
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB if config.state_backend == "rocksdb" else HDFS,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": str(config.changelog_checkpointing).lower(),
        "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.sql.streaming.numRecentProgressUpdates": "1000",
        # Stopping a query during a Python foreachBatch makes Spark match a long
        # Py4J message with a backtracking regex; a bigger stack lets it finish
        # instead of killing the stream thread with StackOverflowError;
        # and the driver maps Spark's classes from this installation's archive (class_archive.py).
        "spark.driver.extraJavaOptions": f"-Xss64m {java_options()}".strip(),
    }
    conf.update(dict(config.spark_conf))
    return conf


def get_or_create_session(config: EnvironmentConfig) -> Any:
    """The active SparkSession if there is one, else a new one for ``config.master``."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.master(config.master).appName("ember")
    for key, value in session_defaults(config).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _quiet_interrupted_writes(spark)
    return spark


# Loggers whose errors only say that a micro-batch's write was interrupted: a job stopping
# while its sources keep admitting input (Spark's own readers, Ember's generators) interrupts
# the batch that has just begun (execution._stop_gracefully), and Spark logs its write as
# aborting. The batch is replayed on restart; a failure that matters fails the query, which
# Ember reports itself.
INTERRUPTED_WRITE_LOGGERS = (
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",  # a streaming sink's write
    "org.apache.spark.sql.execution.datasources.v2.OverwriteByExpressionExec",  # a no-op write in foreachBatch
)


def _quiet_interrupted_writes(spark: Any) -> None:
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    for name in INTERRUPTED_WRITE_LOGGERS:
        log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)


def configure_for_query(spark: Any, config: EnvironmentConfig) -> None:
    """Session settings read when a query starts (a reused session gets them too)."""
    parallelism = config.parallelism or spark.sparkContext.defaultParallelism
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    provider = ROCKSDB if config.state_backend == "rocksdb" else HDFS
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    spark.conf.set(
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
        str(config.changelog_checkpointing).lower(),
    )


ALLOW_MULTIPLE = "spark.sql.streaming.statefulOperator.allowMultiple"


CHECK_CORRECTNESS = "spark.sql.streaming.statefulOperator.checkCorrectness.enabled"


@contextmanager
def lateness_setting(spark: Any, current_watermark: bool, sql_beside_steps: bool = False) -> Iterator[None]:
    """While a query starts: which watermark Spark's late-row filter compares with — the
    current batch's (one stateful operator only; Spark before 3.4) or the previous batch's
    (the default, which lets a query chain stateful operators). A query reads the setting
    when it starts (Spark does not record it in the checkpoint: every start of a job sets it
    again, from the same plan); the session's own value is restored after, so queries that
    are not Ember's do not inherit it.

    ``sql_beside_steps``: a SQL step reads a keyed step's rows, or a keyed step a SQL step's.
    Spark refuses, by default, a stateful operator after one that may emit rows behind the
    watermark (a process function may, as in Flink; a window's results are behind it); the
    operator after it judges those rows (a SQL aggregation drops and counts them as late, a
    keyed step by Flink's rule: docs/sql.md), so the check is turned off for that query."""
    settings = {ALLOW_MULTIPLE: "false" if current_watermark else "true"}
    if sql_beside_steps:
        settings[CHECK_CORRECTNESS] = "false"
    with session_settings(spark, settings):
        yield


CHECKPOINT_FILES = "spark.sql.streaming.checkpointFileManagerClass"
FILESYSTEM_CHECKPOINT_FILES = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
ADAPTIVE = "spark.sql.adaptive.enabled"
ARROW_BATCH_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
UNBOUNDED_BYTES = str(2**31 - 1)  # Spark's "no limit" for the setting above


def query_settings(checkpoint: str, spark_conf: dict[str, str], session: Any = None) -> dict[str, str]:
    """The session settings Ember's query runs with (docs/design/latency.md), unless the
    user's ``spark_conf`` sets them (or ``session``, the user's own SparkSession, sets them itself):

    - a checkpoint on the local file system: its files (offset and commit logs, state files)
      written through Hadoop's FileSystem API rather than FileContext. Both write a temporary
      file and rename it into place (atomic on a local file system) and neither syncs to disk
      (checked with strace); the FileSystem path costs ~7 ms per file here against ~30 ms,
      two of them per micro-batch. Other file systems keep Spark's choice.
    - adaptive query execution off: Spark already leaves it out of the streaming query's own
      plan; it would re-plan, stage by stage, the small DataFrames Ember's sinks run on each
      micro-batch (``foreachBatch``) — ~30 ms per batch at 5 k events, nothing to coalesce.
    - Arrow batches into Python bounded by rows only (``maxRecordsPerBatch``, 65,536 in
      Ember's sessions), not also by bytes: with a byte bound (Spark 4's default, 64 MiB)
      Spark's JVM re-measures the Arrow batch it is building after *every row* it adds
      (``ArrowWriter.sizeInBytes``), which took most of the executor threads' samples on a
      keyed running count (docs/design/latency.md: 1.22 -> 1.68 M events/s). Spark 3's
      behaviour; a user who needs the byte bound (very wide rows) sets it and it holds.
    """
    settings = {ADAPTIVE: "false", ARROW_BATCH_BYTES: UNBOUNDED_BYTES}
    scheme = checkpoint.split("://", 1)[0] if "://" in checkpoint else "file"
    if scheme == "file":
        settings[CHECKPOINT_FILES] = FILESYSTEM_CHECKPOINT_FILES
    own = {k for k in settings if session is not None and session.conf.get(k, None) is not None}
    return {k: v for k, v in settings.items() if k not in spark_conf and k not in own}


@contextmanager
def session_settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` on the session while the block runs (Ember's query: from its start until
    it stopped); the session's own values restored after, so queries that are not Ember's
    (e.g. the benchmarks' hand-written baselines) do not inherit them."""
    before = {k: spark.conf.get(k, None) for k in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _import_runtime(frames: Iterator[Any]) -> Iterator[Any]:
    """A task that imports what Ember's tasks import (keyed runtime, state layouts, Arrow)."""
    import importlib

    import ember.runner.spark.keyed.delta  # noqa: F401
    import ember.runner.spark.keyed.runtime  # noqa: F401
    import ember.runner.spark.keyed.tws  # noqa: F401
    import ember.runner.spark.keyed.vectorized  # noqa: F401

    for optional in ("psycopg", "redis"):  # the external sinks' clients (extras)
        try:
            importlib.import_module(optional)
        except ImportError:
            pass

    yield from frames


def warm_up(spark: Any) -> None:
    """Start what a job's first micro-batch would otherwise wait for, before any checkpoint is
    read (a standby driver, leader.py): Ember's data sources registered with the session, the
    Py4J callback server (driver-side sinks), RocksDB's native library, and in local mode one
    Python worker per core with Ember's runtime and the external sinks' clients imported (Spark
    reuses them; it ends workers idle for a minute, so a waiting standby calls this again now
    and then)."""
    from pyspark.java_gateway import ensure_callback_server_started

    from ember.runner.spark.datasources import register_sources

    register_sources(spark)
    ensure_callback_server_started(spark.sparkContext._gateway)  # driver-side sinks (foreachBatch) call back through it
    spark._jvm.org.rocksdb.RocksDB.loadLibrary()  # the state store's native library
    if not spark.sparkContext.master.startswith("local"):
        return  # on a cluster the executors may all be the running driver's until it dies: nothing to warm yet
    cores = spark.sparkContext.defaultParallelism
    spark.range(0, cores, 1, cores).mapInPandas(_import_runtime, "id long").collect()
