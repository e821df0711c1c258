"""Build the driver JVM's class archive (ember.runner.spark.class_archive): run short jobs of
Ember's usual shape on a JVM that dumps the classes it loaded when it exits, wait for it to
exit, and put the archive in place. ``make venv`` runs it once:

    python -m ember.tools.class_archive
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from ember.runner.spark.class_archive import archive_path, dump_options, seal

__all__ = ["build"]


def _jobs(spark_conf: dict[str, str], root: str) -> None:
    """A window and a keyed process function from a Python source into the driver, and a
    keyed shuffle into the counting sink: the classes most jobs load."""
    from ember import (
        Agg,
        CollectSink,
        CountSink,
        GroupingSource,
        KeyedProcessFunction,
        ScriptedSource,
        StreamEnvironment,
        TumblingEventTimeWindows,
        WatermarkStrategy,
    )
    from ember.state import ValueStateDescriptor

    class Count(KeyedProcessFunction):
        def open(self, ctx):
            self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

        def process_element(self, value, ctx):
            self.n.update(self.n.value() + 1)
            yield {"k": value["k"], "n": self.n.value()}

    env = StreamEnvironment(master="local[2]", checkpoint_dir=root, spark_conf=spark_conf)
    batches = [[(1_000 * i + j, f"k{j % 3}", j) for j in range(10)] for i in range(4)]
    events = env.from_source(ScriptedSource(batches, "ts bigint, k string, v int"),
                             WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"), name="events")
    events.key_by("k").window(TumblingEventTimeWindows.of(timedelta(seconds=2))).aggregate(n=Agg.count()).sink_to(CollectSink())
    events.key_by("k").process(Count(), "k string, n bigint", name="counts").sink_to(CollectSink())
    env.execute("class-archive-steps", progress=False)
    env.from_source(GroupingSource(partitions=2), name="records").key_by("seq_id").sink_to(CountSink())
    env.execute("class-archive-grouping", max_events=100_000, progress=False)


def build() -> Path:
    """Write this installation's archive; returns its path."""
    from pyspark import SparkContext

    path = archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ember-class-archive-") as root:
        _jobs({"spark.driver.extraJavaOptions": f"-Xss64m {dump_options(written)}"}, root)
    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]  # the driver JVM pyspark started
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    jvm.stdin.close()  # the JVM exits when its stdin closes, and writes the archive then
    jvm.wait(timeout=600)
    size = seal(written, path)
    print(f"[ember] the driver JVM's class archive: {path} ({size / 2**20:.0f} MB, {time.monotonic() - started:.0f} s)",
          file=sys.stderr, flush=True)
    return path


if __name__ == "__main__":
    build()
