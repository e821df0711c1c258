"""The benchmark workloads: each an Ember pipeline, its verification and its baseline."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np
from pyspark.sql import functions as F

from ember.api.environment import StreamEnvironment
from ember.bench import baselines
from ember.bench.harness import WARMUP_BATCHES, BenchConfig, RunOutcome, throughput, workload
from ember.bench.jobs import (
    ALERT_SCHEMA,
    ALERT_WINDOW_SCHEMA,
    KEYED_COUNT_SCHEMA,
    KEYED_TIMER_SCHEMA,
    RULES,
    UNRULED,
    AlertsInWindow,
    CountAggregate,
    Dedupe,
    FlowByHand,
    KeyedCount,
    KeyedCountWithTimer,
    RuledStateMachine,
    StateMachine,
    StateMachineVectorized,
)
from ember.bench.verify import check_yahoo_windows
from ember.connectors.external import RedisSink, redis_url, yahoo_window_writer
from ember.connectors.generators import AdClickSource, GrepSource, GroupingSource, RuleSource, StateMachineSource, YahooSource
from ember.connectors.sinks import CollectSink, CountSink, NoopSink
from ember.functions import OutputTag
from ember.job import spark_time_ms
from ember.runner.spark.checkpoint import state_writes
from ember.runner.spark.compiler import compile_graph
from ember.runner.spark.execution import source_origins
from ember.time.watermarks import WatermarkStrategy
from ember.windowing.assigners import TumblingEventTimeWindows
from ember.windowing.triggers import ContinuousProcessingTimeTrigger

GREP_PATTERN = r"[A-Z]{3}\."  # WORKLOADS.md E1: a full-string match that matches nothing


def _env(spark: Any, cfg: BenchConfig, ckpt: str) -> StreamEnvironment:
    return StreamEnvironment(
        master=cfg.master, checkpoint_dir=ckpt, spark=spark, max_events_per_batch=cfg.max_events_per_batch,
        fuse_sources=cfg.options.get("fuse_sources", True), trigger_interval=cfg.options.get("trigger_interval_ms", 0),
        keyed_operator=cfg.options.get("keyed_operator", "auto"), state_layout=cfg.options.get("state_layout", "blob"),
        parallelism=cfg.options.get("parallelism"), max_parallelism=cfg.options.get("max_parallelism"),
    )


def _execute(env: StreamEnvironment, name: str, cfg: BenchConfig) -> tuple[Any, int, float, float]:
    """Run the declared job for the configured duration: ``(result, events, seconds, events/s)``."""
    started = time.monotonic()
    result = env.execute(name, duration_s=cfg.duration_s, progress=cfg.verbose, min_batches=cfg.min_batches)
    wall = time.monotonic() - started
    return (result, *throughput(result.progress, cfg.rate, wall))


def _grep_source(spark: Any, cfg: BenchConfig) -> GrepSource:
    return GrepSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism)


def _pattern(cfg: BenchConfig) -> str:
    return cfg.options.get("pattern") or GREP_PATTERN


def _grep_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    src = _grep_source(spark, cfg)
    reports, _ = baselines.grep_baseline(
        spark, src.all_sentences(), src.partitions, cfg.max_events_per_batch, f"^{_pattern(cfg)}$", cfg.duration_s
    )
    events, seconds, eps = throughput(reports)
    return RunOutcome(events, seconds, eps)


@workload("grep", baseline=_grep_baseline)
def grep(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E1: sentences -> full-string regex match -> count matches."""
    env = _env(spark, cfg, ckpt)
    src = _grep_source(spark, cfg)
    sink = CountSink()
    pattern = _pattern(cfg)
    env.from_source(src, name="sentences").filter(F.col("sentence").rlike(f"^{pattern}$"), name="grep").sink_to(sink)
    result, events, seconds, eps = _execute(env, "bench-grep", cfg)
    expected = src.expected_matches(pattern, 0, result.events)
    return RunOutcome(
        events, seconds, eps, progress=result.progress, verified=sink.count == expected,
        detail={"matches": sink.count, "expected_matches": expected, "pattern": pattern},
    )


def grouping_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    src = GroupingSource()
    reports, lat = baselines.grouping_baseline(
        spark, spark.sparkContext.defaultParallelism, cfg.max_events_per_batch, src.hosts, src.sample_every, cfg.duration_s
    )
    events, seconds, eps = throughput(reports)
    return RunOutcome(events, seconds, eps, latencies_ms=lat)


@workload("grouping", baseline=grouping_baseline)
def grouping(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E2: records -> key_by(seq_id) (a hash shuffle) -> counting sink with sampled latency."""
    env = _env(spark, cfg, ckpt)
    src = GroupingSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism)
    sink = CountSink(latency_field="ts")
    env.from_source(src, name="records").key_by("seq_id").sink_to(sink)
    result, events, seconds, eps = _execute(env, "bench-grouping", cfg)
    # Open loop: latency in the steady state, past the batches that absorb the start-up.
    latencies = sink.latencies_after(WARMUP_BATCHES - 1) if cfg.rate else sink.latencies_ms
    return RunOutcome(
        events, seconds, eps, progress=result.progress, verified=sink.count == result.events, latencies_ms=latencies,
        detail={"sink_count": sink.count, "source_events": result.events},
    )


@workload("grouping-keyed")
def grouping_keyed(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E2 with a keyed state step: records -> key_by(host_id) -> a vectorised running
    count per key (``--keys`` distinct keys, default 1,000; ``--skew`` Zipf-like keys;
    ``--state-layout blob|delta``), verified: every event counted once, every key's
    state created once. Reports what the state costs the checkpoint per batch
    (state_writes) next to the serialized size of the keys each batch changed. With
    ``--prefill`` a first run creates every key (2 M events per batch) and the measured
    run restarts from its checkpoint: each batch then changes keys that exist (with
    ``--drop-copies`` after removing the delta layout's working copies: its first batch
    rebuilds them from the log). ``--step process``: the count is a per-record process
    function that also sets one timer per key (``KeyedCountWithTimer``), verified alike."""
    name = "bench-grouping-keyed"
    keys = int(cfg.options.get("keys") or 1000)
    skew = bool(cfg.options.get("skew"))
    step = cfg.options.get("step") or "vectorised"
    src = GroupingSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism, hosts=keys, skew=skew)
    sinks: list[Any] = []

    def job(env: StreamEnvironment) -> StreamEnvironment:
        keyed = env.from_source(src, name="records").key_by("host_id")
        if step == "process":  # per record, one waiting timer per key (the timer queues' cost)
            sinks.append(CountSink(sum_field="new"))
            keyed.process(KeyedCountWithTimer(), KEYED_TIMER_SCHEMA, name="count").sink_to(sinks[-1])
        else:
            sinks.append(CollectSink())
            keyed.process_batches(KeyedCount("host_id"), KEYED_COUNT_SCHEMA, name="count").sink_to(sinks[-1])
        return env

    prefilled, restore_s, unreported = 0, None, []
    if cfg.options.get("prefill"):
        env = job(_env(spark, replace(cfg, max_events_per_batch=2_000_000), ckpt))
        first = env.execute(name, max_events=keys, progress=cfg.verbose)
        prefilled, unreported = first.events, first.unreported_batches
        if cfg.options.get("drop_copies"):  # the measured run's first batch rebuilds every working copy from the log
            from ember.runner.spark.keyed.delta import drop_local_state

            drop_local_state(os.path.join(ckpt, name))
    env = job(_env(spark, cfg, ckpt))
    result, events, seconds, eps = _execute(env, name, cfg)
    if prefilled and result.progress:  # the first batch after the restart loads the state (or rebuilds copies)
        restore_s = int(result.progress[0]["durationMs"].get("triggerExecution", 0)) / 1000
    total = prefilled + result.events
    distinct = src.distinct_keys(total)
    batches = max(1, sum(1 for p in result.progress if int(p.get("numInputRows") or 0)))
    if step == "process":  # (one row per record, new = 1 for a key's first)
        counted, new_keys = sum(s.count for s in sinks), sum(s.total for s in sinks)
        changed = result.counters.get("state_changed_keys", 0) / batches  # (delta only: what its log wrote)
    else:
        rows = [r for sink in sinks for r in sink.rows()]
        counted = sum(r["events"] for r in rows)
        new_keys = sum(r["new_keys"] for r in rows)
        changed = sum(r["keys"] for r in sinks[-1].rows()) / batches  # the measured run's
    return RunOutcome(
        events, seconds, eps, progress=result.progress,
        verified=bool(result.events) and counted == total and new_keys == distinct,
        detail={"keys": keys, "skew": skew, "step": step, "state_layout": env.config.state_layout, "events_counted": counted,
                "keys_created": new_keys, "expected_keys": distinct, "source_events": total, "prefilled_events": prefilled,
                # batches committed as a run stopped, before Spark reported them (counted from their offsets)
                "unreported_batches": unreported + result.unreported_batches,
                "first_batch_after_restart_s": restore_s, "changed_keys_per_batch": round(changed),
                # a key's state serialized as the delta layout's columns hold it: key and count, 8 bytes each
                # (the vectorised step; a process function's slot is its pickled state and timers)
                "changed_state_bytes_per_batch": round(changed * 16) if step != "process" else None,
                **state_writes(result.checkpoint_dir, len(result.progress)),
                **{k: v for k, v in result.counters.items() if k.startswith("state_")}},
    )


def _expected_counts(events: int, keys: int) -> dict[int, int]:
    """Each key's count among sequence numbers 0 .. events-1 keyed by ``seq % keys``."""
    return {k: events // keys + (1 if k < events % keys else 0) for k in range(min(keys, events))}


def _running_count_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    """The same keyed running count hand-written in PySpark (``groupBy.count``, update mode)."""
    keys = int(cfg.options.get("keys") or 1000)
    reports, latest = baselines.running_count_baseline(
        spark, spark.sparkContext.defaultParallelism, cfg.max_events_per_batch, keys, cfg.duration_s
    )
    events, seconds, eps = throughput(reports)
    total = sum(int(r.get("numInputRows") or 0) for r in reports)
    return RunOutcome(events, seconds, eps, verified=latest == _expected_counts(total, keys))


@workload("rolling", baseline=_running_count_baseline)
def rolling(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """A keyed running count (Bytewax's and Flink's hello-world): records -> key_by(host_id)
    -> ``sum("n", emit="batch")`` (each key's count so far, once per key and micro-batch),
    ``--keys`` distinct keys (default 1,000); verified: every key's last count equals the
    generator's. Baseline: the same in PySpark, ``groupBy(key).count()`` in update mode."""
    env = _env(spark, cfg, ckpt)
    keys = int(cfg.options.get("keys") or 1000)
    src = GroupingSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism, hosts=keys)
    sink = CollectSink()
    (env.from_source(src, name="records").select("host_id", "1 AS n", name="ones").key_by("host_id")
     .sum("n", emit="batch", name="running-count").sink_to(sink))
    result, events, seconds, eps = _execute(env, "bench-rolling", cfg)
    latest: dict[int, int] = {}
    for row in sink.rows():
        latest[row["host_id"]] = max(latest.get(row["host_id"], 0), row["n"])
    return RunOutcome(
        events, seconds, eps, progress=result.progress,
        verified=bool(result.events) and latest == _expected_counts(result.events, keys),
        detail={"keys": keys, "keys_counted": len(latest), "source_events": result.events,
                "output_rows": len(sink.rows())},
    )


TWS_EVENTS_PER_BATCH = 200_000


def _statemachine_source(spark: Any, cfg: BenchConfig):
    return StateMachineSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism, invalid_rate=0.0005)


def _statemachine_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    """Same events (Ember's replayable generator), keyed state in Spark's own TWS."""
    import tempfile

    # TWS runs ~0.1 M events/s here: a 2 M-event batch would outlast a short run,
    # so it reads the same stream in batches it can finish.
    per_batch = min(cfg.max_events_per_batch, TWS_EVENTS_PER_BATCH)
    env = StreamEnvironment(master=cfg.master, checkpoint_dir=tempfile.mkdtemp(prefix="ember-bench-tws-"), spark=spark,
                            max_events_per_batch=per_batch)
    src = _statemachine_source(spark, cfg)

    env.from_source(src, name="events").sink_to(NoopSink())
    job = compile_graph(env.graph(), spark, env.config, job_name="tws", checkpoint=tempfile.mkdtemp())
    reports, alerts = baselines.statemachine_tws_baseline(spark, job.df, cfg.duration_s)
    events, seconds, eps = throughput(reports)
    total = sum(int(r.get("numInputRows") or 0) for r in reports)
    verified = sorted(alerts) == src.expected_alerts(total)
    return RunOutcome(events, seconds, eps, verified=verified, detail={"baseline_events_per_batch": per_batch, "baseline_verified": verified})


def _keyed_e4(spark: Any, cfg: BenchConfig, ckpt: str, name: str, src: StateMachineSource,
              keyed_step: Callable[[Any], Any]) -> tuple[Any, int, float, float, list[dict[str, Any]]]:
    """E4 events (event time) -> key_by(address) -> ``keyed_step`` -> collected:
    ``(result, events, seconds, events/s, rows)``."""
    env = _env(spark, cfg, ckpt)
    sink = CollectSink()
    keyed = env.from_source(src, WatermarkStrategy.for_monotonous_timestamps("ts"), name="events").key_by("address")
    keyed_step(keyed).sink_to(sink)
    result, events, seconds, eps = _execute(env, name, cfg)
    return result, events, seconds, eps, sink.rows()


def _run_statemachine(spark: Any, cfg: BenchConfig, ckpt: str, name: str, keyed_step: Callable[[Any], Any]) -> RunOutcome:
    """E4: state-machine events -> key_by(address) -> ``keyed_step`` -> alerts, verified
    against the invalid events the generator injected."""
    src = _statemachine_source(spark, cfg)
    result, events, seconds, eps, rows = _keyed_e4(spark, cfg, ckpt, name, src, keyed_step)
    got = sorted((r["address"], r["state"], r["type"]) for r in rows)
    expected = src.expected_alerts(result.events)
    return RunOutcome(
        events, seconds, eps, progress=result.progress, verified=bool(result.events) and got == expected,
        detail={"alerts": len(got), "injected": len(expected)},
    )


@workload("statemachine", baseline=_statemachine_baseline)
def statemachine(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E4 with a per-record KeyedProcessFunction and a ValueState per address."""
    return _run_statemachine(
        spark, cfg, ckpt, "bench-statemachine", lambda k: k.process(StateMachine(), ALERT_SCHEMA, name="state-machine")
    )


@workload("statemachine-vectorized", baseline=_statemachine_baseline)
def statemachine_vectorized(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E4 with the vectorised keyed variant (``process_batches`` + ``StateMachineVectorized``)."""
    return _run_statemachine(
        spark, cfg, ckpt, "bench-statemachine-vectorized",
        lambda k: k.process_batches(StateMachineVectorized(), ALERT_SCHEMA, name="state-machine"),
    )


PIPELINE_WINDOW_MS = 1_000


@workload("pipeline")
def pipeline(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """Three stateful steps in one job (issue 17): E4 events -> per-address dedupe
    (``ValueState`` with TTL) -> per-address state machine -> alerts counted per 1 s
    event-time window (a Python ``AggregateFunction`` listing them). The state machine reads
    the dedupe through ``reinterpret_as_keyed("address")`` — both steps are keyed by the
    address — so the two run chained in one operator (Flink's operator chaining;
    ``pipeline-unchained`` re-keys with ``key_by`` instead). Verified: every window the job
    emitted holds exactly the alerts of the generator's injected events in it, and every
    window up to the last one emitted was emitted."""
    return _pipeline(spark, cfg, ckpt, chained=True)


@workload("pipeline-unchained")
def pipeline_unchained(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """``pipeline`` with ``key_by("address")`` between the dedupe and the state machine: two
    operators and a shuffle between them, as Flink runs two keyBy steps. Verified alike."""
    return _pipeline(spark, cfg, ckpt, chained=False)


def _pipeline(spark: Any, cfg: BenchConfig, ckpt: str, chained: bool) -> RunOutcome:
    env = _env(spark, cfg, ckpt)
    # Event time advances 2 s per full micro-batch at unbounded speed: windows close every batch.
    src = StateMachineSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism, invalid_rate=0.0005,
                             nominal_rate=max(1, cfg.max_events_per_batch // 2))
    sink = CollectSink()
    deduped = (env.from_source(src, WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
               .key_by("address").process(Dedupe(), src.schema_ddl, name="dedupe"))
    keyed = deduped.reinterpret_as_keyed("address") if chained else deduped.key_by("address")
    (keyed.process(StateMachine(), ALERT_SCHEMA, name="state-machine")
     .key_by("state").window(TumblingEventTimeWindows.of(PIPELINE_WINDOW_MS))
     .aggregate(AlertsInWindow(), output_schema=ALERT_WINDOW_SCHEMA, name="alerts-per-second")
     .sink_to(sink))
    result, events, seconds, eps = _execute(env, "bench-pipeline", cfg)
    per_window: dict[tuple[int, int], list[str]] = {}  # one row per (state, window): merged
    counts_agree = True
    for r in sink.rows():
        listed = r["detail"].split() if r["detail"] else []
        counts_agree &= r["alerts"] == len(listed)
        per_window.setdefault((r["window_start"], r["window_end"]), []).extend(listed)
    got = {w: (len(a), " ".join(sorted(a))) for w, a in per_window.items()}
    expected: dict[tuple[int, int], list[str]] = {}
    for address, kind, ts in src.expected_alert_events(result.events, result.start_ms["events"]):
        start = ts - ts % PIPELINE_WINDOW_MS
        expected.setdefault((start, start + PIPELINE_WINDOW_MS), []).append(f"{address}:{kind}")
    last = max((end for _, end in got), default=0)
    wanted = {w: (len(a), " ".join(sorted(a))) for w, a in expected.items() if w[1] <= last}
    return RunOutcome(
        events, seconds, eps, progress=result.progress, verified=bool(got) and counts_agree and got == wanted,
        detail={"windows": len(got), "alerts": sum(n for n, _ in got.values()),
                "injected_in_emitted_windows": sum(n for n, _ in wanted.values())},
    )


# --------------------------------------------------------------------------- broadcast state (issue 17)
@workload("connect")
def connect(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E4 events checked against rules changing every second of event time (issue 17):
    ``events.key_by(address).connect(rules.broadcast(RULES)).process(RuledStateMachine)`` —
    the state machine's alerts reported when the rule of their second says so. Verified:
    the alerts are exactly the generator's injected events whose second's rule (RuleSource,
    computed independently) reports their type, and no event found its second without a rule."""
    env = _env(spark, cfg, ckpt)
    parts = spark.sparkContext.defaultParallelism
    nominal = max(1, cfg.max_events_per_batch // 2)  # 2 s of event time per full micro-batch
    start_ms = int(time.time()) * 1000  # whole seconds: an event's second is ts // 1000
    common = dict(rate=cfg.rate, partitions=parts, nominal_rate=nominal, start_ms=start_ms,
                  max_events_per_batch=cfg.max_events_per_batch)
    src = StateMachineSource(invalid_rate=0.0005, **common)
    rule_src = RuleSource(**common)
    sink = CollectSink()
    monotonous = WatermarkStrategy.for_monotonous_timestamps("ts")
    events = env.from_source(src, monotonous, name="events")
    rules = env.from_source(rule_src, monotonous, name="rules")
    (events.key_by("address").connect(rules.broadcast(RULES))
     .process(RuledStateMachine(), ALERT_SCHEMA, name="ruled-state-machine").sink_to(sink))
    result, events_in, seconds, eps = _execute(env, "bench-connect", cfg)  # (the rules among them: one per second of event time)
    read = max(_read_per_source(result), default=0)  # the events (the rules: one per second)
    alerts = sorted((r["address"], r["state"], r["type"]) for r in sink.rows())
    injected = src.expected_alert_events(read, start_ms)
    seconds_k = np.array([ts // 1000 - start_ms // 1000 for _, _, ts in injected], dtype=np.int64)
    masks = rule_src.mask_of(seconds_k) if len(injected) else np.array([], dtype=np.int64)
    expected = sorted((a, "Initial", t) for (a, t, _), m in zip(injected, masks) if (int(m) >> t) & 1)
    unruled = sum(1 for a in alerts if a[1] == UNRULED)
    return RunOutcome(
        events_in, seconds, eps, progress=result.progress, verified=read > 0 and unruled == 0 and alerts == expected,
        detail={"alerts": len(alerts), "expected_alerts": len(expected), "injected": len(injected), "unruled": unruled},
    )


# --------------------------------------------------------------------------- interval join (issue 17)
CLICK_EVERY = 10  # one click per ten impressions
CLICK_DELAY_MS = 10_000  # a click comes within 10 s of its impression: the join's upper bound


def _ad_click_sources(spark: Any, cfg: BenchConfig) -> tuple[AdClickSource, AdClickSource]:
    """Impressions and their clicks from one origin; at unbounded speed event time advances
    20 s per full micro-batch, so a batch's clicks find their impressions in the same batch
    or the one before, and the join forgets impressions a batch or two after reading them."""
    per_batch = cfg.max_events_per_batch
    common = dict(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism, click_every=CLICK_EVERY,
                  max_delay_ms=CLICK_DELAY_MS, nominal_rate=max(1, per_batch // 20), start_ms=int(time.time() * 1000))
    impressions = AdClickSource(side="impressions", max_events_per_batch=per_batch, **common)
    clicks = AdClickSource(side="clicks", max_events_per_batch=max(1, per_batch // CLICK_EVERY), **common)
    return impressions, clicks


def _per_source_events(reports: list[dict[str, Any]]) -> list[int]:
    """Input rows per source over ``reports`` (in the order Spark lists the sources)."""
    totals: list[int] = []
    for report in reports:
        for i, source in enumerate(report.get("sources", [])):
            if i == len(totals):
                totals.append(0)
            totals[i] += int(source.get("numInputRows") or 0)
    return totals


def _read_per_source(result: Any) -> list[int]:
    """Events read per source: Spark's reports, plus the batches committed as the run stopped,
    before Spark reported them (JobResult.unreported_batches; their sinks' rows are kept), from
    the sources' offsets in the log."""
    from ember.runner.spark.checkpoint import offset_log_entry
    from ember.runner.spark.progress import events_per_source

    totals = _per_source_events(result.progress)
    for bid in result.unreported_batches:
        start = offset_log_entry(result.checkpoint_dir, bid - 1)[1] if bid > 0 else []
        for i, n in enumerate(events_per_source(start, offset_log_entry(result.checkpoint_dir, bid)[1])):
            totals.extend([0] * (i + 1 - len(totals)))
            totals[i] += n or 0
    return totals


def _checked_pairs(src: AdClickSource, read_per_source: list[int], count: int, total: int) -> tuple[bool, dict[str, Any]]:
    read = sorted(read_per_source, reverse=True)  # impressions outnumber clicks
    impressions, clicks = (read + [0, 0])[:2]
    pairs, ids = src.expected_pairs(impressions, clicks)
    ok = pairs > 0 and count == pairs and total == ids
    return ok, {"impressions": impressions, "clicks": clicks, "pairs": count, "expected_pairs": pairs,
                "impression_id_sum": total, "expected_impression_id_sum": ids}


def _interval_join_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    """The same join hand-written in PySpark (withWatermark on each side, a time-range
    join condition, a foreachBatch counting the pairs and summing their impression ids)
    on the same generated sources."""
    import tempfile

    impressions, clicks = _ad_click_sources(spark, cfg)
    frames = []
    for src, name in ((impressions, "impressions"), (clicks, "clicks")):
        env = _env(spark, cfg, tempfile.mkdtemp(prefix="ember-bench-join-"))
        env.from_source(src, name=name).sink_to(NoopSink())
        frames.append(compile_graph(env.graph(), spark, env.config, job_name=f"plain-{name}",
                                    checkpoint=tempfile.mkdtemp()).df)
    reports, count, total = baselines.interval_join_baseline(spark, frames[0], frames[1], CLICK_DELAY_MS, cfg.duration_s)
    events, seconds, eps = throughput(reports)
    ok, detail = _checked_pairs(impressions, _per_source_events(reports), count, total)
    return RunOutcome(events, seconds, eps, verified=ok, detail=detail)


@workload("interval-join", baseline=_interval_join_baseline)
def interval_join(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """Impressions joined with their clicks within 10 s of event time (issue 17): an
    interval join on ``impression_id``, ``between(0, 10 s)``, projected natively. Verified:
    the pairs' count and the sum of their impression ids equal the generator's for the
    impressions and clicks read (every click's impression was read with it or before)."""
    env = _env(spark, cfg, ckpt)
    impressions, clicks = _ad_click_sources(spark, cfg)
    sink = CountSink(sum_field="impression_id")
    shown = env.from_source(impressions, WatermarkStrategy.for_monotonous_timestamps("ts"), name="impressions")
    clicked = env.from_source(
        clicks, WatermarkStrategy.for_bounded_out_of_orderness(CLICK_DELAY_MS, "ts"), name="clicks")
    (shown.key_by("impression_id").interval_join(clicked.key_by("impression_id"), name="attributed")
        .between(0, CLICK_DELAY_MS)
        .select("left.impression_id AS impression_id", "left.ad_id AS ad_id", "right.ts - left.ts AS delay_ms")
        .sink_to(sink))
    result, events, seconds, eps = _execute(env, "bench-interval-join", cfg)
    ok, detail = _checked_pairs(impressions, _read_per_source(result), sink.count, sink.total)
    return RunOutcome(events, seconds, eps, progress=result.progress, verified=ok, detail=detail)


# --------------------------------------------------------------------------- E5 Yahoo
YAHOO_WINDOW_MS = 10_000  # WORKLOADS.md E5: 10 s tumbling windows


def _yahoo_bench_source(spark: Any, cfg: BenchConfig) -> Any:
    """Yahoo events; at unbounded speed their event time advances 5 s per full
    micro-batch, so 10 s windows close (and are verified) every other batch."""
    return YahooSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism,
                       nominal_rate=max(1, cfg.max_events_per_batch // 5))


def _yahoo_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    """The same job hand-written in PySpark, on the same generated events."""
    import tempfile

    env = _env(spark, cfg, tempfile.mkdtemp(prefix="ember-bench-yahoo-"))
    src = _yahoo_bench_source(spark, cfg)
    env.from_source(src, name="ad-events").sink_to(NoopSink())
    job = compile_graph(env.graph(), spark, env.config, job_name="plain-yahoo", checkpoint=tempfile.mkdtemp())
    reports, rows = baselines.yahoo_baseline(spark, job.df, src.campaign_table(), YAHOO_WINDOW_MS, cfg.duration_s)
    return _checked_windows(env, src, job, reports, rows, YAHOO_WINDOW_MS)


@workload("yahoo", baseline=_yahoo_baseline)
def yahoo(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E5, final results only: generated ad events -> views -> campaign (broadcast
    lookup) -> count per campaign and 10 s event-time window (Spark's native window
    aggregation); every emitted count verified against the generator, and every
    window that closed must be emitted. Under ``--rate`` the latency of each window
    (its emission time minus its end) is reported."""
    env = _env(spark, cfg, ckpt)
    src = _yahoo_bench_source(spark, cfg)
    sink = CollectSink()
    _yahoo_views(_yahoo_events(env, src), src).window(TumblingEventTimeWindows.of(YAHOO_WINDOW_MS)).count(name="views-per-window").sink_to(sink)
    result, events, seconds, eps = _execute(env, "bench-yahoo", cfg)
    check = check_yahoo_windows(src, sink.rows(), result.events, result.start_ms["ad-events"], YAHOO_WINDOW_MS,
                                result.final_watermark_ms)
    latencies = [b.arrival_ms - r["window_end"] for b in sink.batches for r in b.rows] if cfg.rate else []
    return RunOutcome(
        events, seconds, eps, progress=result.progress, verified=check.ok and check.windows > 0, latencies_ms=latencies,
        detail={"windows": check.windows, "wrong": len(check.wrong), "missing": len(check.missing)},
    )


# --------------------------------------------------------------------------- E5 with JSON events
YAHOO_JSON_SCHEMA = "ad_id string not null, event_type string not null, event_time string not null"


def _yahoo_json_source(spark: Any, cfg: BenchConfig) -> Any:
    return YahooSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism,
                       nominal_rate=max(1, cfg.max_events_per_batch // 5), as_json=True)


def _yahoo_json_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    """Plain PySpark's ``from_json`` pipeline on the same JSON texts (Ember's generator,
    read as text); then, for the record, BASELINES.md's form of it: texts made in the
    JVM by ``to_json`` from the same generated events (its throughput in ``detail``)."""
    import tempfile

    from pyspark.sql import functions as F

    def decoded(texts: Any) -> Any:
        return texts.select(F.from_json("event", YAHOO_JSON_SCHEMA.replace(" not null", "")).alias("e")).select("e.*")

    outcomes = []
    sources = [_yahoo_json_source(spark, cfg)]
    if cfg.options.get("to_json_baseline", True):
        sources.append(_yahoo_bench_source(spark, cfg))
    for src in sources:
        env = _env(spark, cfg, tempfile.mkdtemp(prefix="ember-bench-yahoo-json-"))
        env.from_source(src, name="ad-events").sink_to(NoopSink())
        job = compile_graph(env.graph(), spark, env.config, job_name="plain-yahoo-json", checkpoint=tempfile.mkdtemp())
        texts = job.df if src.as_json else job.df.select(F.to_json(F.struct(*job.df.columns)).alias("event"))
        reports, rows = baselines.yahoo_baseline(spark, decoded(texts), src.campaign_table(), YAHOO_WINDOW_MS,
                                                 cfg.duration_s)
        outcomes.append(_checked_windows(env, src, job, reports, rows, YAHOO_WINDOW_MS))
    same = outcomes[0]
    for to_json in outcomes[1:]:
        same.verified = same.verified and to_json.verified
        same.detail["to_json_baseline_events_per_second"] = round(to_json.events_per_second)
    return same


@workload("yahoo-json", baseline=_yahoo_json_baseline)
def yahoo_json(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E5 with events as JSON texts, as from a broker: each event one JSON object,
    decoded by ``parse_json`` (every record validated, only the three fields the job
    reads extracted; bad records to a dead-letter sink) -> views -> campaign -> count
    per campaign and 10 s event-time window; every count verified, no dead letter."""
    env = _env(spark, cfg, ckpt)
    src = _yahoo_json_source(spark, cfg)
    bad = OutputTag("bad_json")
    sink, dead = CollectSink(), CountSink()
    decoded = _yahoo_events(env, src).parse_json("event", YAHOO_JSON_SCHEMA, dead_letter=bad, name="decode")
    _yahoo_views(decoded, src).window(TumblingEventTimeWindows.of(YAHOO_WINDOW_MS)).count(name="views-per-window").sink_to(sink)
    decoded.get_side_output(bad).sink_to(dead, name="dead-letters")
    result, events, seconds, eps = _execute(env, "bench-yahoo-json", cfg)
    check = check_yahoo_windows(src, sink.rows(), result.events, result.start_ms["ad-events"], YAHOO_WINDOW_MS,
                                result.final_watermark_ms)
    latencies = [b.arrival_ms - r["window_end"] for b in sink.batches for r in b.rows] if cfg.rate else []
    return RunOutcome(
        events, seconds, eps, progress=result.progress, verified=check.ok and check.windows > 0 and dead.count == 0,
        latencies_ms=latencies,
        detail={"windows": check.windows, "wrong": len(check.wrong), "missing": len(check.missing),
                "dead_letters": dead.count},
    )


YAHOO_REDIS_RATE = 100_000  # events/s when --rate is not given: yahoo-redis measures latency, open loop


def _batch_start_ms(progress: list[dict[str, Any]], index: int) -> int:
    """When batch ``index`` of a run started (epoch ms; the last one's if the run had fewer)."""
    if not progress:
        return 0
    return spark_time_ms(progress[min(index, len(progress) - 1)]["timestamp"]) or 0


def _redis_windows(client: Any, prefix: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(campaign, window start) -> (seen_count, time_updated) as the Yahoo layout stores them under ``prefix``."""
    out = {}
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        if client.type(key) != "hash":
            continue
        fields = client.hgetall(key)
        if "seen_count" in fields:
            continue  # a window's hash; reached through its campaign's
        for ts, window_id in fields.items():
            if ts.isdigit():
                w = client.hgetall(window_id)
                out[(key[len(prefix):], int(ts))] = (int(w["seen_count"]), int(w["time_updated"]))
    return out


def _delete_prefix(client: Any, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i:i + 1000])


@workload("yahoo-redis")
def yahoo_redis(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E5 as the original: open-loop ad events (``--rate``, default 100,000/s, event
    time = generation time) -> views -> campaign -> 10 s event-time windows on Ember's
    window operator whose count is written to the real Redis (the Yahoo layout, exactly
    once) every second while the window is open and finally at its end. Verified from
    Redis: every closed window's final ``seen_count`` equals the generator's count.
    Latency per closed window = its final ``time_updated`` minus its end (windows ending
    after the warm-up batches started)."""
    import uuid

    import redis

    env = _env(spark, cfg, ckpt)
    # Open loop by default; unbounded (event time advancing per batch, no latency) only for
    # the drain run of a max-rate search.
    rate = None if cfg.rate is None and cfg.options.get("drain") else (cfg.rate or YAHOO_REDIS_RATE)
    size_ms = int(cfg.options.get("window_ms") or YAHOO_WINDOW_MS)  # smaller in the CI smoke: windows close sooner
    src = (YahooSource(rate=rate, partitions=spark.sparkContext.defaultParallelism) if rate
           else _yahoo_bench_source(spark, cfg))
    prefix = f"ember:bench:yahoo-redis:{uuid.uuid4().hex[:8]}:"
    sink = RedisSink(write=yahoo_window_writer(cumulative=True, prefix=prefix))
    (_yahoo_views(_yahoo_events(env, src), src).window(TumblingEventTimeWindows.of(size_ms))
     .trigger(ContinuousProcessingTimeTrigger.of(1000, fire_at_end=True))
     .count(name="views-per-window").sink_to(sink, name="redis"))
    client = redis.Redis.from_url(redis_url(), decode_responses=True)
    try:
        result, events, seconds, eps = _execute(env, "bench-yahoo-redis", cfg)
        stored = _redis_windows(client, prefix)
    finally:
        _delete_prefix(client, prefix)
    watermark = result.final_watermark_ms
    closed = {k: v for k, v in stored.items() if watermark is not None and k[1] + size_ms <= watermark}
    rows = [{"campaign_id": c, "window_start": ts, "count": n} for (c, ts), (n, _) in closed.items()]
    check = check_yahoo_windows(src, rows, result.events, result.start_ms["ad-events"], size_ms, watermark)
    # Latency in steady state: windows that ended after the warm-up batches started (the first
    # batches also start the job's Python workers; a window ending then waits for them) — as
    # for throughput, a run of too few batches counts them all.
    steady_from = _batch_start_ms(result.progress, WARMUP_BATCHES) if len(result.progress) > WARMUP_BATCHES + 2 else 0
    latencies = [updated - (ts + size_ms) for (_, ts), (_, updated) in closed.items() if ts + size_ms >= steady_from] if rate else []
    return RunOutcome(
        events, seconds, eps, progress=result.progress, verified=check.ok and check.windows > 0, latencies_ms=latencies,
        detail={"windows": check.windows, "open_windows_in_redis": len(stored) - len(closed), "wrong": len(check.wrong),
                "missing": len(check.missing), "rate": rate, "window_ms": size_ms},
    )


# --------------------------------------------------------------------------- windows on Ember's operator
WINDOW_MS = 1000  # 1 s windows: a 20 s run closes enough of them to verify


def _yahoo_events(env: StreamEnvironment, src: Any) -> Any:
    """The Yahoo source, its event time from ``event_time`` (1 s out of orderness)."""
    return env.from_source(src, WatermarkStrategy.for_bounded_out_of_orderness(1000, "event_time"), name="ad-events")


def _yahoo_views(events: Any, src: Any) -> Any:
    """Yahoo events -> views -> campaign (broadcast lookup) -> (campaign_id, event_time), keyed by campaign."""
    import pandas as pd

    campaigns = pd.DataFrame(src.campaign_table(), columns=["ad_id", "campaign_id"])
    return (
        events.filter("event_type = 'view'", name="views")
        .select("ad_id", "CAST(event_time AS BIGINT) AS event_time", name="project")
        .join_lookup(campaigns, on="ad_id", name="campaign-lookup")
        .select("campaign_id", "event_time", name="campaign-views")
        .key_by("campaign_id")
    )


def _yahoo_source(spark: Any, cfg: BenchConfig) -> Any:
    """Yahoo events whose event time advances 1 s per full micro-batch at unbounded speed,
    so windows close (and are verified) at any batch size."""
    return YahooSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism, nominal_rate=cfg.max_events_per_batch)


def _yahoo_views_job(spark: Any, cfg: BenchConfig, name: str) -> tuple[StreamEnvironment, Any, Any]:
    """The keyed Yahoo views stream compiled (not started), for a baseline to read ``job.df``."""
    import tempfile

    env = _env(spark, cfg, tempfile.mkdtemp(prefix="ember-bench-tws-"))
    src = _yahoo_source(spark, cfg)
    _yahoo_views(_yahoo_events(env, src), src).sink_to(NoopSink())
    return env, src, compile_graph(env.graph(), spark, env.config, job_name=name, checkpoint=tempfile.mkdtemp())


def _window_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    """The same windowed count in Spark's own ``transformWithStateInPandas`` (event-time timers)."""
    env, src, job = _yahoo_views_job(spark, cfg, "tws-window")
    reports, rows = baselines.window_tws_baseline(spark, job.df, "campaign_id", "event_time", WINDOW_MS, cfg.duration_s)
    return _checked_windows(env, src, job, reports, rows, WINDOW_MS)


def _checked_windows(env: StreamEnvironment, src: Any, job: Any, reports: list[dict], rows: list[dict], size_ms: int) -> RunOutcome:
    """A baseline run's outcome: its throughput, and its window counts checked
    against the generator (every emitted count exact, none twice)."""
    events, seconds, eps = throughput(reports)
    total = sum(int(r.get("numInputRows") or 0) for r in reports)
    origin = _origin(env, job)
    check = check_yahoo_windows(src, rows, total, origin, size_ms, None) if origin is not None else None
    verified = bool(check and check.windows and not check.wrong and not check.duplicated)
    return RunOutcome(events, seconds, eps, verified=verified, detail={"baseline_windows": check.windows if check else 0})


def _origin(env: StreamEnvironment, job: Any) -> int | None:
    return source_origins(job.compilation.checkpoint, env.graph()).get("ad-events")


@workload("window", baseline=_window_baseline)
def window(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """Yahoo views per campaign in 1 s event-time tumbling windows, counted by a
    Python ``AggregateFunction`` on Ember's window operator; verified exactly."""
    env = _env(spark, cfg, ckpt)
    src = _yahoo_source(spark, cfg)
    sink = CollectSink()
    (
        _yahoo_views(_yahoo_events(env, src), src)
        .window(TumblingEventTimeWindows.of(WINDOW_MS))
        .aggregate(CountAggregate(), output_schema="count bigint", name="views-per-window")
        .sink_to(sink)
    )
    result, events, seconds, eps = _execute(env, "bench-window", cfg)
    check = check_yahoo_windows(src, sink.rows(), result.events, result.start_ms["ad-events"], WINDOW_MS, result.final_watermark_ms)
    return RunOutcome(
        events, seconds, eps, progress=result.progress, verified=check.ok,
        detail={"windows": check.windows, "wrong": len(check.wrong), "missing": len(check.missing)},
    )


COUNT_WINDOW = 1000


def _campaign_views(src: Any, events: int) -> dict[str, int]:
    """Views per campaign among the first ``events`` events (the generator's ground truth)."""
    import numpy as np

    counts = np.zeros(src.campaigns, dtype=np.int64)
    for a in range(0, events, 4_000_000):
        r = src.reference(a, min(events, a + 4_000_000), 0)
        views = r["ad"][r["event_type"] == 0] // src.ads_per_campaign
        counts += np.bincount(views, minlength=src.campaigns)
    return dict(zip(src.ids["campaigns"], counts.tolist()))


def _check_count_windows(src: Any, rows: list[dict], events: int) -> tuple[bool, dict[str, Any]]:
    """Every campaign fired ``views // N`` windows of exactly N views."""
    views = _campaign_views(src, events)
    fired: dict[str, int] = {}
    wrong = 0
    for row in rows:
        fired[row["campaign_id"]] = fired.get(row["campaign_id"], 0) + 1
        wrong += int(row["count"]) != COUNT_WINDOW
    missing = sum(abs(fired.get(c, 0) - v // COUNT_WINDOW) for c, v in views.items())
    return bool(rows) and not wrong and not missing, {"windows": len(rows), "wrong": wrong, "missing_or_extra": missing}


def _countwindow_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    """The same count windows in Spark's own ``transformWithStateInPandas`` (a per-key counter)."""

    env, src, job = _yahoo_views_job(spark, cfg, "tws-countwindow")
    reports, rows = baselines.countwindow_tws_baseline(spark, job.df, "campaign_id", COUNT_WINDOW, cfg.duration_s)
    events, seconds, eps = throughput(reports)
    total = sum(int(r.get("numInputRows") or 0) for r in reports)
    verified, detail = _check_count_windows(src, rows, total)
    return RunOutcome(events, seconds, eps, verified=verified, detail={"baseline_" + k: v for k, v in detail.items()})


@workload("countwindow", baseline=_countwindow_baseline)
def countwindow(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """Yahoo views per campaign in tumbling count windows of 1,000, counted by a Python
    ``AggregateFunction``; verified: each campaign fired exactly views // 1000 full windows."""
    env = _env(spark, cfg, ckpt)
    src = _yahoo_source(spark, cfg)
    sink = CollectSink()
    (
        _yahoo_views(_yahoo_events(env, src), src)
        .count_window(COUNT_WINDOW)
        .aggregate(CountAggregate(), output_schema="count bigint", name="views-per-1000")
        .sink_to(sink)
    )
    result, events, seconds, eps = _execute(env, "bench-countwindow", cfg)
    verified, detail = _check_count_windows(src, sink.rows(), result.events)
    return RunOutcome(events, seconds, eps, verified=verified, detail=detail, progress=result.progress)


# --------------------------------------------------------------------------- CEP (issue 21)
CEP_WINDOW_MS = 10_000
OPENS, CLOSE = (1, 3), 7  # E4: a flow opens with a or c and closes with g (abeg, cbeg, cdg)
FLOW_SCHEMA = "address int, opened bigint, closed bigint"


def _cep_source(spark: Any, cfg: BenchConfig) -> StateMachineSource:
    return StateMachineSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism, invalid_rate=0.0005,
                              start_ms=1_700_000_000_000)


def _expected_flows(src: StateMachineSource, read: int) -> list[tuple[int, int, int]]:
    """The oracle, from the generator's arrays (numpy, not a matcher): per address, every
    close event (g, not injected) with the first open event (a or c) after the address'
    previous close, and their timestamps — each flow of E4 spans milliseconds, far within
    the window (asserted)."""
    out: list[tuple[int, int, int]] = []
    eps = int(src.events_per_second)
    origin = int(src.start_ms or 0)
    for p in range(src.partitions):
        n = len(range(p, read, src.partitions))
        addr, types, injected = src.events(p, 0, n)
        order = np.argsort(addr, kind="stable")  # per address, in arrival order
        a, t, inj = addr[order], types[order], injected[order]
        pos = np.arange(len(a))
        is_open = np.isin(t, OPENS) & ~inj
        is_close = (t == CLOSE) & ~inj
        last_close = np.maximum.accumulate(np.where(is_close, pos, -1))
        prev_close = np.concatenate(([-1], last_close[:-1]))
        group_start = np.concatenate(([True], a[1:] != a[:-1]))
        first_of_group = np.maximum.accumulate(np.where(group_start, pos, 0))
        opens = np.nonzero(is_open)[0]
        closes = np.nonzero(is_close)[0]
        after = np.maximum(prev_close[closes] + 1, first_of_group[closes])  # where this close's flow may open
        first_open = np.searchsorted(opens, after)
        found = first_open < len(opens)
        opened = np.where(found, opens[np.minimum(first_open, len(opens) - 1)], -1)
        ok = found & (opened < closes)
        seq = order.astype(np.int64) * src.partitions + p  # the event's sequence number in the stream
        ts = origin + (seq * 1000) // eps
        flows = list(zip(a[closes[ok]].tolist(), ts[opened[ok]].tolist(), ts[closes[ok]].tolist()))
        assert all(closed - opened_ms < CEP_WINDOW_MS for _, opened_ms, closed in flows)
        out.extend(flows)
    return sorted(out)


def _run_flows(spark: Any, cfg: BenchConfig, ckpt: str, name: str, step: Callable[[Any], Any]) -> RunOutcome:
    src = _cep_source(spark, cfg)
    result, events, seconds, eps, rows = _keyed_e4(spark, cfg, ckpt, name, src, step)
    got = sorted((r["address"], r["opened"], r["closed"]) for r in rows)
    expected = _expected_flows(src, result.events)
    # The last batch's flows may still wait for the watermark (event time): every flow
    # emitted must be expected, and every expected flow the last watermark passed emitted.
    # Spark's watermark W drops records before W, so W is Flink's W - 1: a flow closing at
    # W itself waits for a later record (a run that ends on a batch without input has W =
    # the latest timestamp read, and many events share that millisecond).
    final_wm = result.final_watermark_ms or 0
    settled = [f for f in expected if f[2] < final_wm]
    verified = bool(got) and set(got) <= set(expected) and set(settled) <= set(got) and len(got) == len(set(got))
    return RunOutcome(events, seconds, eps, progress=result.progress, verified=verified,
                      detail={"matches": len(got), "expected": len(expected), "settled_expected": len(settled)})


def _flows_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    """The same flows found by a hand-written KeyedProcessFunction (one ValueState per address)."""
    import tempfile

    return _run_flows(spark, cfg, tempfile.mkdtemp(prefix="ember-bench-flows-"), "bench-flows-process",
                      lambda k: k.process(FlowByHand(CEP_WINDOW_MS), FLOW_SCHEMA, name="flows-by-hand"))


@workload("cep", baseline=_flows_baseline)
def cep(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E4 events matched with a CEP pattern per address (issue 21): a flow that opens (a or c)
    and closes (g) within 10 s, ``skip_past_last_event``; verified against a numpy oracle
    from the generator; baseline: the same logic as a hand-written process function."""
    from ember.cep import CEP, Pattern, SkipStrategy

    pattern = (Pattern.begin("open", skip=SkipStrategy.skip_past_last_event()).where(lambda e: e["type"] in OPENS)
               .followed_by("close").where(lambda e: e["type"] == CLOSE).within(CEP_WINDOW_MS))
    return _run_flows(spark, cfg, ckpt, "bench-cep", lambda k: CEP.pattern(k, pattern).select(
        lambda m: {"address": m["open"][0]["address"], "opened": m["open"][0]["ts"], "closed": m["close"][0]["ts"]},
        FLOW_SCHEMA, name="flows"))
