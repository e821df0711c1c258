"""Source translators: one builder per source declaration type."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from pyspark.sql import functions as F

from ember.connectors import generators as g
from ember.connectors.base import Source
from ember.connectors.external import RedisStreamSource, redis_url
from ember.connectors.spark_sources import FileSource, RateSource, ScriptedSource
from ember.errors import PipelineError
from ember.graph.nodes import SourceNode
from ember.runner.spark.checkpoint import SOURCE_ID_OPTION, START_OFFSETS_OPTION, fixed_origin
from ember.runner.spark.compilation import Compilation, Frame, registry, translates
from ember.runner.spark.generator_batches import source_spec
from ember.runner.spark.keyed.packing import PACKED_ROWS, PackSpec

__all__ = ["SOURCE_BUILDERS", "packed_source", "positioned"]

SourceBuilder = Callable[[Compilation, SourceNode, Any], Any]
SOURCE_BUILDERS: dict[type[Source], SourceBuilder] = {}
builds = registry(SOURCE_BUILDERS)  # @builds(SourceType): the DataFrame builder of one source type


@translates(SourceNode)
def translate_source(comp: Compilation, node: SourceNode) -> Frame:
    builder = SOURCE_BUILDERS.get(type(node.source))
    if builder is None:
        raise PipelineError(f"the Spark runner has no reader for {type(node.source).__name__}", node.name)
    return Frame(builder(comp, node, node.source), time=node.watermark)


def positioned(comp: Compilation, reader: Any, source_id: str) -> Any:
    """An Ember Python source's reader, named ``source_id`` among the job's sources, which starts
    where a converted checkpoint says (checkpoint.start_offset; savepoints/convert.py)."""
    return reader.option(SOURCE_ID_OPTION, source_id).option(START_OFFSETS_OPTION, comp.layout.start_offsets)


# --------------------------------------------------------------------------- Spark's own
def _no_latency_target(comp: Compilation, node: SourceNode, what: str) -> None:
    if comp.config.latency_target_ms is not None:
        raise PipelineError(
            f"latency_target adapts how much Ember's sources admit per micro-batch; {what} is read by Spark's own "
            "reader, which Ember cannot bound at run time (use trigger_interval and the source's own per-batch "
            "option instead, or an Ember source)", node.name)


@builds(FileSource)
def _files(comp: Compilation, node: SourceNode, src: FileSource) -> Any:
    _no_latency_target(comp, node, "FileSource")
    comp.unstoppable.append(node.name)
    reader = comp.spark.readStream.format(src.format)
    if src.format != "text":
        reader = reader.schema(src.schema)
    if src.max_files_per_batch:
        reader = reader.option("maxFilesPerTrigger", src.max_files_per_batch)
    for k, v in src.options:
        reader = reader.option(k, v)
    return reader.load(src.path)


@builds(RateSource)
def _rate(comp: Compilation, node: SourceNode, src: RateSource) -> Any:
    _no_latency_target(comp, node, "RateSource")
    comp.unstoppable.append(node.name)
    reader = comp.spark.readStream.format("rate").option("rowsPerSecond", src.rows_per_second)
    if src.partitions:
        reader = reader.option("numPartitions", src.partitions)
    return reader.load()


@builds(ScriptedSource)
def _scripted(comp: Compilation, node: SourceNode, src: ScriptedSource) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = _parse_datatype_string(src.schema)
    if not isinstance(schema, StructType):
        raise PipelineError(f"ScriptedSource: schema must list fields ('a int, b string'), got {src.schema!r}", node.name)
    names = schema.names
    batches = []
    for i, batch in enumerate(src.batches):
        rows = []
        for row in batch:
            values = [row.get(n) for n in names] if isinstance(row, dict) else list(row)
            if len(values) != len(names):
                raise PipelineError(
                    f"scripted batch {i} has row {row!r} with {len(values)} values; schema has {len(names)} fields",
                    node.name,
                )
            rows.append(values)
        batches.append(rows)
    return (
        positioned(comp, comp.spark.readStream.format("ember_scripted"), node.name)
        .option("schema", src.schema)
        .option("batches", json.dumps(batches))
        .option("partitions", str(src.partitions))
        .option("stop_marker", comp.stop_marker or "")
        .option("done_file", comp.done_file(node))
        .option("in_driver", "1" if src.partitions == 1 and _in_driver_allowed() else "0")  # (few rows: a script)
        .load()
    )


def _bound_file(comp: Compilation) -> str:
    """Where the latency-target controller writes the per-batch bound ("" without a target)."""
    return comp.layout.batch_bound if comp.config.latency_target_ms is not None else ""


# --------------------------------------------------------------------------- external systems
@builds(RedisStreamSource)
def _redis_streams(comp: Compilation, node: SourceNode, src: RedisStreamSource) -> Any:
    from ember.runner.spark.fenced_writes import check_redis

    url = redis_url(src.url)
    check_redis(url, node.name)  # unreachable Redis fails before the job starts
    return (
        positioned(comp, comp.spark.readStream.format("ember_redis_streams"), node.name)
        .option("url", url)
        .option("streams", json.dumps(list(src.streams)))
        .option("schema", src.schema)
        .option("fields", json.dumps(src.fields))
        .option("max_events_per_batch", src.max_events_per_batch)
        .option("read_chunk", src.read_chunk)
        .option("dead_letter", src.dead_letter)
        .option("json_field", src.json_field or "")
        .option("stop_at_end", "true" if src.stop_at_end else "false")
        .option("stop_marker", comp.stop_marker or "")
        .option("bound_file", _bound_file(comp))
        .option("in_driver", "1" if _reads_in_driver(comp, {}, src.max_events_per_batch) else "0")
        .load()
    )


# --------------------------------------------------------------------------- generators
def _sequence(comp: Compilation, node: SourceNode, src: g.GeneratorSource, schema: str, **fused: str) -> Any:
    """The sequence numbers (``seq``) and event-time origin (``origin_ms``) of a generator.

    Rate-limited and bounded generators run on Ember's Python source, which
    fixes the origin when the query first starts and logs it in its offsets.
    Unbounded-speed ones run on Spark's native ``rate-micro-batch`` (faster),
    with the origin fixed once in the checkpoint (``ember/origin-<step>``, see ``fixed_origin``).
    """
    per_batch = src.max_events_per_batch or comp.config.max_events_per_batch
    if src.needs_python_driver or comp.config.latency_target_ms is not None:  # (Spark's reader has a fixed bound)
        reader = positioned(comp, comp.spark.readStream.format("ember_sequence"), node.name)
        for option, value in fused.items():  # a step fused into the reader (pack, decode)
            reader = reader.option(option, value)
        return (
            reader.option("schema", schema)
            .option("spec", json.dumps(source_spec(src, per_batch)))
            .option("stop_marker", comp.stop_marker or "")
            .option("origin_file", comp.layout.origin(node.name))
            .option("bound_file", _bound_file(comp))
            .option("done_file", comp.done_file(node))
            .option("in_driver", "1" if _reads_in_driver(comp, fused, per_batch) else "0")
            .load()
        )
    origin = src.start_ms if src.start_ms is not None else fixed_origin(comp.layout.origin(node.name))
    comp.unstoppable.append(node.name)
    return (
        comp.spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", per_batch)
        .option("numPartitions", src.partitions)
        .option("startTimestamp", origin)
        .load()
        .select(F.col("value").alias("seq"), F.lit(origin).cast("bigint").alias("origin_ms"))
    )


IN_DRIVER_SWITCH = "EMBER_SOURCE_READS"  # "tasks" in the driver's environment: no source reads in the driver
IN_DRIVER_BELOW_MS = 500  # latency targets under this read a generator's batches in the driver
IN_DRIVER_MAX_EVENTS = 20_000  # as do batches bounded to at most this many events


def _reads_in_driver(comp: Compilation, fused: dict[str, str], per_batch: int) -> bool:
    """Whether a generator's sequence (or a Redis streams source) reads its micro-batches in
    the driver's source process (Spark's simple reader) rather than in a Python task per
    partition (per stream): where its batches stay
    small — at most :data:`IN_DRIVER_MAX_EVENTS` events, or under a latency target below
    :data:`IN_DRIVER_BELOW_MS` (which keeps them small) — so that a task's ~50-70 ms is a large
    share of a batch, and without a step fused into the reader (packing or decoding every
    record in one process would cost more). Measured: docs/design/latency.md, "Small batches
    read in the driver"."""
    target = comp.config.latency_target_ms
    small = per_batch <= IN_DRIVER_MAX_EVENTS or (target is not None and target < IN_DRIVER_BELOW_MS)
    return small and not fused and _in_driver_allowed()


def _in_driver_allowed() -> bool:
    """Off with ``EMBER_SOURCE_READS=tasks`` in the driver's environment (to measure against)."""
    return os.environ.get(IN_DRIVER_SWITCH, "auto") != "tasks"


def _event_time(comp: Compilation, node: SourceNode, src: g.GeneratorSource) -> Any:
    return F.col("origin_ms") + F.expr(f"seq * 1000 div {int(src.events_per_second)}")


def _ingestion_ms(comp: Compilation, node: SourceNode, src: g.GeneratorSource) -> Any:
    """Open loop: the scheduled emission time; unbounded speed: the micro-batch start."""
    if src.rate is not None:
        return _event_time(comp, node, src)
    return F.unix_millis(F.current_timestamp())


def _pick(values: list[str], index: Any) -> Any:
    # One SQL array literal: a column of F.lit per value costs a JVM call each
    # (4,000 sentences took 2.5 s to declare).
    quoted = ", ".join("'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'" for v in values)
    return F.element_at(F.expr(f"array({quoted})"), (index + 1).cast("int"))


def _hash(src: g.GeneratorSource) -> Any:
    return F.xxhash64(F.col("seq"), F.lit(src.seed).cast("bigint"))


@builds(g.YahooSource)
def _yahoo(comp: Compilation, node: SourceNode, src: g.YahooSource) -> Any:
    if src.as_json:  # the JSON texts are made by Ember's Python reader (generator_batches.py)
        return _sequence(comp, node, src, src.schema_ddl)
    seq = _sequence(comp, node, src, "seq bigint, origin_ms bigint")
    h = _hash(src)
    t = _event_time(comp, node, src)
    if src.skew_ms:
        t = t + F.pmod(F.shiftright(h, 48), F.lit(2 * src.skew_ms + 1)) - F.lit(src.skew_ms)
    ids = src.ids
    return seq.select(
        _pick(ids["users"], F.pmod(F.shiftright(h, 20), F.lit(100))).alias("user_id"),
        _pick(ids["pages"], F.pmod(F.shiftright(h, 30), F.lit(100))).alias("page_id"),
        _pick(ids["ads"], F.pmod(h, F.lit(src.num_ads))).alias("ad_id"),
        _pick(list(g.AD_TYPES), F.pmod(F.shiftright(h, 40), F.lit(5))).alias("ad_type"),
        _pick(list(g.EVENT_TYPES), F.pmod(F.shiftright(h, 10), F.lit(3))).alias("event_type"),
        t.cast("string").alias("event_time"),
        F.lit("1.2.3.4").alias("ip_address"),
    )


@builds(g.GrepSource)
def _grep(comp: Compilation, node: SourceNode, src: g.GrepSource) -> Any:
    seq = _sequence(comp, node, src, "seq bigint, origin_ms bigint")
    p, s = src.partitions, src.sentences_per_partition
    index = F.pmod(F.col("seq"), F.lit(p)) * s + F.pmod(F.expr(f"seq div {p}"), F.lit(s))
    return seq.select(_pick(src.all_sentences(), index).alias("sentence"), _event_time(comp, node, src).alias("ts"))


@builds(g.GroupingSource)
def _grouping(comp: Compilation, node: SourceNode, src: g.GroupingSource) -> Any:
    seq = _sequence(comp, node, src, "seq bigint, origin_ms bigint")
    sampled = F.pmod(F.col("seq"), F.lit(src.sample_every)) == 0
    host = F.pmod(F.col("seq"), F.lit(src.hosts))
    if src.skew:  # GroupingSource.host_ids, the same integer arithmetic
        h = f"xxhash64(seq, CAST({int(src.seed)} AS BIGINT))"  # as _hash
        width = f"shiftleft(CAST(1 AS BIGINT), CAST(pmod({h}, {src.skew_levels}) AS INT))"
        host = F.expr(f"pmod({width} - 1 + pmod(shiftright({h}, 8), {width}), {int(src.hosts)})")
    return seq.select(
        F.col("seq").alias("seq_id"),
        host.cast("int").alias("host_id"),
        (_event_time(comp, node, src) if src.event_time else F.when(sampled, _ingestion_ms(comp, node, src)).otherwise(F.lit(0)))
        .cast("bigint").alias("ts"),
        F.lit(bytearray(b"ember-pay-12")).alias("payload"),
    )


@builds(g.AdClickSource)
def _ad_clicks(comp: Compilation, node: SourceNode, src: g.AdClickSource) -> Any:
    seq = _sequence(comp, node, src, "seq bigint, origin_ms bigint")
    h = _hash(src)
    if src.side == "impressions":
        return seq.select(
            F.col("seq").alias("impression_id"),
            F.pmod(h, F.lit(src.ads)).cast("int").alias("ad_id"),
            _event_time(comp, node, src).alias("ts"),
        )
    impression = F.col("seq") * F.lit(src.click_every)
    shown = F.col("origin_ms") + F.expr(f"seq * {src.click_every} * 1000 div {int(src.events_per_second)}")
    return seq.select(
        F.col("seq").alias("click_id"),
        impression.alias("impression_id"),
        (shown + F.pmod(h, F.lit(src.max_delay_ms))).alias("ts"),
    )


@builds(g.RuleSource)
def _rules(comp: Compilation, node: SourceNode, src: g.RuleSource) -> Any:
    seq = _sequence(comp, node, src, "seq bigint, origin_ms bigint")
    eps = int(src.events_per_second)
    k = F.expr(f"seq div {eps}")  # seconds after the origin
    governed = F.when(k == 0, F.sequence(F.lit(0).cast("bigint"), F.lit(src.lead_s).cast("bigint")))
    governed = governed.otherwise(F.array(k + F.lit(src.lead_s)))
    firsts = seq.filter(F.pmod(F.col("seq"), F.lit(eps)) == 0)
    rules = firsts.select((F.col("origin_ms") + k * 1000).alias("ts"), F.col("origin_ms"), F.explode(governed).alias("k"))
    return rules.select(
        "ts",
        (F.expr("origin_ms div 1000") + F.col("k")).alias("second"),
        F.pmod(F.xxhash64(F.col("k").cast("bigint"), F.lit(src.seed).cast("bigint")), F.lit(128)).cast("int").alias("mask"),
    )


@builds(g.StateMachineSource)
def _statemachine(comp: Compilation, node: SourceNode, src: g.StateMachineSource) -> Any:
    return _sequence(comp, node, src, src.schema_ddl)


# --------------------------------------------------------------------------- source fusion
def packed_source(comp: Compilation, node: SourceNode, spec: PackSpec) -> Any | None:
    """``node``'s records already packed per state bucket by its Python reader
    (``(bucket, rows[, latest event time])`` rows, keyed/packing.py), or None when
    its source cannot pack (Spark-generated or JVM sources)."""
    src = node.source
    if not isinstance(src, g.StateMachineSource):  # the generators whose records Python makes
        return None
    schema = f"{spec.bucket_column} int, {PACKED_ROWS} binary"
    if spec.time_field is not None:
        schema += f", {spec.time_field} bigint"
    return _sequence(comp, node, src, schema, pack=spec.to_json())


def decodes_at_source(node: Any) -> bool:
    """Whether ``node`` is a source whose Python reader can run a ``parse_json`` step itself."""
    return isinstance(node, SourceNode) and isinstance(node.source, g.YahooSource) and node.source.as_json


def decoded_source(comp: Compilation, node: SourceNode, plan: Any) -> Any:
    """``node``'s records decoded by ``plan`` (translators/decoding.py ``DecodePlan``) in its reader."""
    ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in plan.output_struct.fields)
    return _sequence(comp, node, node.source, ddl, decode=plan.to_json())
