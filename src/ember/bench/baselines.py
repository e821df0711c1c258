"""The same workloads hand-written in plain PySpark, for same-run overhead ratios.

These pipelines use no Ember code on the data path: Spark's ``rate-micro-batch``
source, the generator's fields as Spark SQL, and a ``foreachBatch`` sink doing
the same counting as Ember's :class:`~ember.connectors.sinks.CountSink`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from typing import Any, Callable

from pyspark.sql import functions as F

__all__ = ["run_plain_query", "grep_baseline", "grouping_baseline", "statemachine_tws_baseline", "interval_join_baseline"]


# Windows close a few batches after they start (the watermark trails the newest
# event): a windowed baseline runs at least this many batches so it has windows to verify.
WINDOW_BATCHES = 4


def run_plain_query(writer: Any, on_batch: Callable[[Any, int], None], duration_s: float, min_batches: int = 1,
                    grace_s: float = 60.0) -> list[dict[str, Any]]:
    """Run ``writer`` (a DataStreamWriter) with ``on_batch`` as its ``foreachBatch``
    for ``duration_s`` and until ``min_batches`` batches have ended (at most
    ``grace_s`` longer: a slow, shared machine must not leave a baseline with
    nothing to measure or verify); return the progress reports of the batches
    ``on_batch`` handled.

    Spark's own sources cannot be told to stop admitting input and, with a
    trigger interval of 0, a new batch starts the moment one ends, so there is
    no quiet moment to stop in. Instead, once the run is over, the batch that
    starts is skipped (its rows are read and dropped — Spark refuses to commit
    a stateful batch that did not run — without ``on_batch``) and left out of
    the reports, and the query stops once that batch has been reported: the
    batches handled before it have ended, none is cut short.
    """
    handled: set[int] = set()
    skipped: list[int] = []
    over = threading.Event()

    def gate(batch: Any, batch_id: int) -> None:
        if over.is_set():
            batch.write.format("noop").mode("append").save()
            skipped.append(batch_id)
            return
        on_batch(batch, batch_id)
        handled.add(batch_id)

    ckpt = tempfile.mkdtemp(prefix="ember-baseline-")
    query = writer.foreachBatch(gate).option("checkpointLocation", ckpt).trigger(processingTime="0 seconds").start()
    reports: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + duration_s
    hard_deadline = deadline + grace_s
    try:
        while query.isActive:
            now = time.monotonic()
            if now >= hard_deadline or (now >= deadline and len(handled) >= min_batches):
                break
            time.sleep(min(1.0, max(0.02, deadline - now)))
        over.set()
        stop_by = time.monotonic() + 120
        # The batch in flight (if any) ends, handled or skipped; the next one is skipped.
        while query.isActive and time.monotonic() < stop_by:
            last = query.lastProgress
            if skipped and last is not None and int(last["batchId"]) >= skipped[0]:
                break
            time.sleep(0.005)
        for p in query.recentProgress:  # kept by Spark: the last 1,000 reports
            reports[int(p.batchId)] = json.loads(p.json)
    finally:
        query.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    if query.exception() is not None:
        raise RuntimeError(f"baseline query failed: {query.exception()}")
    # A handled batch's report may be missing if the stop came before Spark reported it;
    # its input is then missing from the reports, as is its output from no result (the
    # callers count events from the reports and check results against that count).
    missing = handled - set(reports)
    if missing:
        raise RuntimeError(f"baseline batches {sorted(missing)} ended without a progress report")
    return [reports[k] for k in sorted(reports) if k in handled]


def _sequence(spark: Any, per_batch: int, partitions: int) -> Any:
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", per_batch)
        .option("numPartitions", partitions)
        .load()
    )


def running_count_baseline(spark: Any, partitions: int, per_batch: int, keys: int, duration_s: float) -> tuple[list[dict], dict[int, int]]:
    """Plain PySpark keyed running count: ``groupBy(key).count()`` in update mode — each
    batch emits every key it touched with its count so far; returns the reports and each
    key's latest count."""
    df = _sequence(spark, per_batch, partitions).select(F.pmod(F.col("value"), F.lit(keys)).cast("int").alias("host_id"))
    latest: dict[int, int] = {}

    def keep(batch: Any, batch_id: int) -> None:
        for row in batch.collect():
            latest[row["host_id"]] = max(latest.get(row["host_id"], 0), row["count"])

    reports = run_plain_query(df.groupBy("host_id").count().writeStream.outputMode("update"), keep, duration_s)
    return reports, latest


def grep_baseline(spark: Any, sentences: list[str], partitions: int, per_batch: int, pattern: str, duration_s: float) -> tuple[list[dict], int]:
    """Plain PySpark grep: pick each record's sentence, ``rlike``, count matches."""
    n = len(sentences) // partitions
    v = F.col("value")
    idx = F.pmod(v, F.lit(partitions)) * n + F.pmod(F.expr(f"value div {partitions}"), F.lit(n))
    arr = F.array(*[F.lit(s) for s in sentences])
    df = _sequence(spark, per_batch, partitions).select(
        F.element_at(arr, (idx + 1).cast("int")).alias("sentence"), v.alias("ts")
    ).filter(F.col("sentence").rlike(pattern))
    matches = {}

    def count(batch: Any, batch_id: int) -> None:
        matches[batch_id] = batch.count()

    reports = run_plain_query(df.writeStream, count, duration_s)
    return reports, sum(matches.values())


def grouping_baseline(spark: Any, partitions: int, per_batch: int, hosts: int, sample_every: int, duration_s: float) -> tuple[list[dict], list[int]]:
    """Plain PySpark grouping: records -> repartition by seq_id -> count, sampled latency."""
    v = F.col("value")
    df = _sequence(spark, per_batch, partitions).select(
        v.alias("seq_id"),
        F.pmod(v, F.lit(hosts)).cast("int").alias("host_id"),
        F.when(F.pmod(v, F.lit(sample_every)) == 0, F.unix_millis(F.current_timestamp())).otherwise(0).alias("ts"),
        F.lit(bytearray(b"ember-pay-12")).alias("payload"),
    ).repartition(spark.sparkContext.defaultParallelism, "seq_id")
    latencies: dict[int, list[int]] = {}

    def count(batch: Any, batch_id: int) -> None:
        row = batch.agg(F.count(F.lit(1)).alias("n"), F.collect_list(F.when(F.col("ts") > 0, F.col("ts"))).alias("s")).collect()[0]
        now = time.time_ns() // 1_000_000
        latencies[batch_id] = [now - int(t) for t in row["s"]]

    reports = run_plain_query(df.writeStream, count, duration_s)
    return reports, [x for k in sorted(latencies) for x in latencies[k]]


def statemachine_tws_baseline(spark: Any, events: Any, duration_s: float) -> tuple[list[dict], list[tuple]]:
    """Spark's own keyed state: ``transformWithStateInPandas`` with a per-address
    ``ValueState``, the E4 state machine over the same event stream ``events``."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from ember.connectors.generators import STATE_NAMES, TRANSITIONS

    class StateMachineProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("state", StructType([StructField("s", IntegerType())]))

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            current = self.state.get()[0] if self.state.exists() else 0
            alerts = []
            for pdf in rows:
                for t in pdf["type"].tolist():
                    following = TRANSITIONS.get(current, {}).get(t)
                    if following is None:
                        alerts.append((key[0], STATE_NAMES[current], t))
                    else:
                        current = 0 if following == 5 else following
            if current == 0:
                self.state.clear()
            else:
                self.state.update((current,))
            if alerts:
                yield pd.DataFrame(alerts, columns=["address", "state", "type"])

        def close(self) -> None:
            pass

    out = StructType([StructField("address", IntegerType()), StructField("state", StringType()), StructField("type", IntegerType())])
    alerts: list[tuple] = []

    def collect(batch: Any, batch_id: int) -> None:
        alerts.extend(tuple(r) for r in batch.collect())

    df = events.groupBy("address").transformWithStateInPandas(
        statefulProcessor=StateMachineProcessor(), outputStructType=out, outputMode="Append", timeMode="None"
    )
    reports = run_plain_query(df.writeStream, collect, duration_s)
    return reports, alerts


def window_tws_baseline(spark: Any, events: Any, key: str, time_field: str, size_ms: int, duration_s: float) -> tuple[list[dict], list[dict]]:
    """Spark's own keyed state doing ``ember bench window``'s job: a count per key
    and event-time tumbling window in ``transformWithStateInPandas`` — a
    ``MapState`` of window start -> count per key (vectorised per key with pandas)
    and an event-time timer per window end that emits and clears it."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class WindowCount(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.counts = handle.getMapState("counts", "start long", "n long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            for pdf in rows:
                starts = pdf[time_field] - pdf[time_field] % size_ms
                for start, n in starts.value_counts().items():
                    prev = self.counts.getValue((int(start),))
                    if prev is None:
                        self.handle.registerTimer(int(start) + size_ms - 1)
                    self.counts.updateValue((int(start),), (int(n) + (prev[0] if prev else 0),))
            return iter([])

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
            start = expiredTimerInfo.getExpiryTimeInMs() + 1 - size_ms
            got = self.counts.getValue((start,))
            if got is not None:
                self.counts.removeKey((start,))
                yield pd.DataFrame({key_name: [key[0]], "window_start": [start], "count": [got[0]]})

        def close(self) -> None:
            pass

    key_name = key
    out = StructType([StructField(key, StringType()), StructField("window_start", LongType()), StructField("count", LongType())])
    rows: list[dict] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows.extend(r.asDict() for r in batch.collect())

    timed = events.withColumn("__ts", F.timestamp_millis(F.col(time_field))).withWatermark("__ts", "1 second")
    df = timed.groupBy(key).transformWithStateInPandas(
        statefulProcessor=WindowCount(), outputStructType=out, outputMode="Append", timeMode="EventTime"
    )
    reports = run_plain_query(df.writeStream, collect, duration_s, min_batches=WINDOW_BATCHES)
    return reports, rows


def countwindow_tws_baseline(spark: Any, events: Any, key: str, size: int, duration_s: float) -> tuple[list[dict], list[dict]]:
    """Spark's own keyed state doing ``ember bench countwindow``'s job: a per-key
    ``ValueState`` counter in ``transformWithStateInPandas`` emitting one row per
    ``size`` records (vectorised per key)."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class CountWindow(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.seen = handle.getValueState("seen", "n long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            seen = self.seen.get()[0] if self.seen.exists() else 0
            for pdf in rows:
                seen += len(pdf)
            fired, seen = divmod(seen, size)
            self.seen.update((seen,))
            if fired:
                yield pd.DataFrame({key_name: [key[0]] * fired, "count": [size] * fired})

        def close(self) -> None:
            pass

    key_name = key
    out = StructType([StructField(key, StringType()), StructField("count", LongType())])
    rows: list[dict] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows.extend(r.asDict() for r in batch.collect())

    df = events.groupBy(key).transformWithStateInPandas(
        statefulProcessor=CountWindow(), outputStructType=out, outputMode="Append", timeMode="None"
    )
    reports = run_plain_query(df.writeStream, collect, duration_s)
    return reports, rows


def yahoo_baseline(spark: Any, events: Any, campaigns: list[tuple[str, str]], window_ms: int, duration_s: float) -> tuple[list[dict], list[dict]]:
    """WORKLOADS.md E5 hand-written in PySpark on the same generated ``events``: views,
    a broadcast join to campaigns, a count per campaign and event-time tumbling
    window (Spark's native aggregation, final results only), collected per batch."""
    mapping = spark.createDataFrame(campaigns, "ad_id string, campaign_id string")
    rows: list[dict] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows.extend(r.asDict() for r in batch.collect())

    counts = (
        events.filter(F.col("event_type") == "view")
        .select("ad_id", F.timestamp_millis(F.col("event_time").cast("long")).alias("ts"))
        .join(F.broadcast(mapping), "ad_id")
        .withWatermark("ts", "1 second")
        .groupBy("campaign_id", F.window("ts", f"{window_ms} milliseconds"))
        .count()
        .select("campaign_id", F.unix_millis(F.col("window.start")).alias("window_start"), "count")
    )
    reports = run_plain_query(counts.writeStream.outputMode("append"), collect, duration_s,
                               min_batches=WINDOW_BATCHES)
    return reports, rows


def interval_join_baseline(spark: Any, impressions: Any, clicks: Any, delay_ms: int,
                           duration_s: float) -> tuple[list[dict[str, Any]], int, int]:
    """Impressions joined with clicks within ``delay_ms`` of event time, as a PySpark user
    writes it; returns the progress reports, the pairs' count and their impression ids' sum."""
    shown = (impressions.withColumn("shown_at", F.timestamp_millis("ts"))
             .withWatermark("shown_at", "0 seconds").alias("i"))
    clicked = (clicks.withColumn("clicked_at", F.timestamp_millis("ts"))
               .withWatermark("clicked_at", f"{delay_ms} milliseconds").alias("c"))
    joined = shown.join(clicked, F.expr(
        f"i.impression_id = c.impression_id AND c.clicked_at >= i.shown_at "
        f"AND c.clicked_at <= i.shown_at + INTERVAL {delay_ms} MILLISECONDS"
    )).select(F.col("i.impression_id").alias("impression_id"), F.col("i.ad_id").alias("ad_id"),
              (F.col("c.ts") - F.col("i.ts")).alias("delay_ms"))
    counted: dict[int, tuple[int, int]] = {}

    def on_batch(batch: Any, batch_id: int) -> None:
        row = batch.agg(F.count(F.lit(1)).alias("n"),
                        F.coalesce(F.sum(F.col("impression_id").cast("decimal(38,0)")), F.lit(0)).alias("s")).collect()[0]
        counted[batch_id] = (int(row["n"]), int(row["s"]))

    reports = run_plain_query(joined.writeStream, on_batch, duration_s, min_batches=WINDOW_BATCHES)
    handled = {int(r["batchId"]) for r in reports}
    kept = [v for k, v in counted.items() if k in handled]
    return reports, sum(n for n, _ in kept), sum(s for _, s in kept)
