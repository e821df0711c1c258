"""Compile a pipeline graph into one Spark Structured Streaming query.

Each graph node type has exactly one translator in ``TRANSLATORS`` (filled by
the modules of :mod:`ember.runner.spark.translators`). A node without a
translator, or one Spark rejects while the plan is built, fails here — before
the job starts — with the step's name in the message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ember.api.environment import EnvironmentConfig
from ember.errors import EmberError, PipelineError
from ember.graph.graph import Graph
from ember.graph.nodes import Node, SideOutputNode, SinkNode
from ember.time.watermarks import WatermarkStrategy

__all__ = ["Frame", "Compilation", "CompiledJob", "TRANSLATORS", "translates", "registry", "compile_graph"]


@dataclass(frozen=True)
class Frame:
    """A translated step: its Spark DataFrame and the stream's notion of time."""

    df: Any
    time: WatermarkStrategy | None = None


def registry(table: dict[type, Callable[..., Any]]) -> Callable[[type], Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """A decorator factory filling ``table`` with one function per declaration type."""

    def for_type(kind: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if kind in table:
                raise RuntimeError(f"two functions registered for {kind.__name__}")
            table[kind] = fn
            return fn

        return register

    return for_type


Translator = Callable[["Compilation", Node], Frame]
TRANSLATORS: dict[type[Node], Translator] = {}
translates = registry(TRANSLATORS)  # @translates(NodeType): the translator of one node type


@dataclass
class Compilation:
    """State of one compilation: the session, settings and translated frames."""

    graph: Graph
    spark: Any
    config: EnvironmentConfig
    job_name: str
    checkpoint: str | None
    end_of_input_marker: str | None = None
    stop_marker: str | None = None
    uses_end_of_input: bool = False  # an end-of-input row was compiled in: flush it when sources end
    frames: dict[int, Frame] = field(default_factory=dict)
    tagged: dict[int, Frame] = field(default_factory=dict)  # combined main + side outputs of a step
    side_types: dict[int, Any] = field(default_factory=dict)  # step -> {side output: StructType}
    counters: dict[str, Any] = field(default_factory=dict)  # Spark accumulators, by name
    key_types: dict[str, list[str]] = field(default_factory=dict)  # keyed step -> its key fields' Spark types
    detoured: dict[int, str] = field(default_factory=dict)  # step -> spool directory of its detoured dead letters
    # Sources read by Spark's own readers, which keep admitting input after the stop marker.
    unstoppable: list[str] = field(default_factory=list)

    @property
    def job_id(self) -> str:
        """The job's identity, fixed in its checkpoint when the job first starts
        (sinks fence their writes under it: a new checkpoint is a new job)."""
        if self.checkpoint is None:
            return "explain"
        from ember.runner.spark.datasources import fixed_token

        return fixed_token(os.path.join(self.checkpoint, "ember", "job-id"))

    def counter(self, name: str) -> Any:
        """A job-wide Spark accumulator (e.g. late records dropped by Ember's windows)."""
        if name not in self.counters:
            self.counters[name] = self.spark.sparkContext.accumulator(0)
        return self.counters[name]

    @property
    def parallelism(self) -> int:
        return self.config.parallelism or self.spark.sparkContext.defaultParallelism

    @property
    def bounded(self) -> bool:
        return all(s.source.bounded for s in self.graph.sources)

    def branch(self, fork: Node, rows: Frame) -> "Compilation":
        """A compilation of the steps after ``fork`` on ``rows`` (its output in one micro-batch)."""
        branch = replace(self, frames={}, tagged={}, side_types=dict(self.side_types))
        if id(fork) in self.tagged:
            branch.tagged[id(fork)] = rows
            branch.frames[id(fork)] = main_output(rows)
        else:
            branch.frames[id(fork)] = rows
        return branch

    def frame(self, node: Node) -> Frame:
        """The translated frame of ``node`` (translated once, then reused)."""
        if id(node) in self.frames:
            return self.frames[id(node)]
        translator = TRANSLATORS.get(type(node))
        if translator is None:
            raise PipelineError(f"the Spark runner cannot run a {type(node).__name__} step", node.name)
        try:
            frame = translator(self, node)
        except EmberError:
            raise
        except Exception as exc:  # Spark's analysis errors: unknown column, type mismatch...
            raise PipelineError(_spark_message(exc), node.name) from exc
        if self.side_types.get(id(node)):
            self.tagged[id(node)] = frame
            frame = main_output(frame)
        self.frames[id(node)] = frame
        return frame


def main_output(combined: Frame) -> Frame:
    """The main stream of a step that also has side outputs."""
    from pyspark.sql import functions as F

    from ember.runner.spark.keyed.runtime import SIDE_PREFIX, TAG

    df = combined.df
    main = [c for c in df.columns if c != TAG and not c.startswith(SIDE_PREFIX)]
    return Frame(df.filter(F.col(TAG).isNull()).select(*main), combined.time)


@dataclass(frozen=True)
class Detour:
    """A side output that leaves the query through a spool (spool.py): its sinks are
    written per micro-batch from the spooled rows, after the streamed sinks."""

    side: SideOutputNode
    sinks: list[SinkNode]
    directory: str


@dataclass
class CompiledJob:
    """A translated job: ``frame`` is what the streaming query computes — the
    one sink's input, or, for several sinks, the step where they split (``fork``).
    ``sinks`` are every sink of the job, detoured ones (``detours``) included."""

    sinks: list[SinkNode]
    frame: Frame
    compilation: Compilation
    fork: Node | None = None
    sink_schemas: dict[int, Any] = field(default_factory=dict)  # id(sink node) -> StructType of its rows
    detours: list[Detour] = field(default_factory=list)

    @property
    def streamed_sinks(self) -> list[SinkNode]:
        return _streamed(self.sinks, self.detours)

    @property
    def df(self) -> Any:
        return self.frame.df

    @property
    def output_mode(self) -> str:
        return "append"

    def writer(self) -> Any:
        """``writeStream`` for the job's sink(s)."""
        from ember.runner.spark.translators.sinks import sink_writer

        if self.fork is None and not self.detours:
            return sink_writer(self.sinks[0], self.df, self.target(self.sinks[0]))
        return self.df.writeStream.foreachBatch(self._fan_out)

    def target(self, sink: SinkNode) -> Any:
        from ember.runner.spark.external import SinkTarget

        return SinkTarget(self.compilation.job_id, sink.name)

    def prepare_sinks(self) -> None:
        """Check or create every sink's target (tables, connections) before the job starts."""
        from ember.runner.spark.translators.sinks import prepare_sink

        for sink in self.sinks:
            prepare_sink(sink, self.sink_schemas.get(id(sink), self.df.schema))

    def _fan_out(self, batch: Any, batch_id: int) -> None:
        """Every sink's branch on one micro-batch of the split step's rows."""
        from ember.runner.spark.translators.sinks import write_batch

        from ember.runner.spark.spool import clear_spool, read_spool

        streamed = self.streamed_sinks
        if self.fork is None:
            write_batch(streamed[0], batch, batch_id, self.target(streamed[0]))
        else:
            batch.persist()
            try:
                branch = self.compilation.branch(self.fork, Frame(batch, self.frame.time))
                for sink in streamed:
                    write_batch(sink, branch.frame(sink.inputs[0]).df, batch_id, self.target(sink))
            finally:
                batch.unpersist()
        for detour in self.detours:  # the streamed sinks ran the batch's tasks, which spooled these rows
            rows = read_spool(self.compilation.spark, detour.directory, batch_id)
            if rows is not None:
                branch = self.compilation.branch(detour.side, Frame(rows, None))
                for sink in detour.sinks:
                    write_batch(sink, branch.frame(sink.inputs[0]).df, batch_id, self.target(sink))
            clear_spool(detour.directory, batch_id)

    def spark_plan(self) -> str:
        df = self.frame.df
        return df._sc._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "extended")


def compile_graph(
    graph: Graph,
    spark: Any,
    config: EnvironmentConfig,
    *,
    job_name: str,
    checkpoint: str | None,
    end_of_input_marker: str | None = None,
    stop_marker: str | None = None,
) -> CompiledJob:
    """Translate ``graph`` (validated) for ``spark``; nothing starts running."""
    from ember.runner.spark import translators  # noqa: F401 - fills TRANSLATORS
    from ember.runner.spark.datasources import register_sources
    from ember.runner.spark.translators.sinks import check_sink

    register_sources(spark)
    comp = Compilation(graph, spark, config, job_name, checkpoint, end_of_input_marker, stop_marker)
    for sink in graph.sinks:
        check_sink(sink)
    from ember.runner.spark.deadletters import DEAD_LETTER_STRUCT

    fork, sides = graph.split()
    detours = [_detour(comp, side) for side in sides]
    comp.detoured = {id(d.side.inputs[0]): d.directory for d in detours}
    schemas = {}
    for d in detours:  # each detoured branch checked on the spooled rows' schema now, not mid-job
        empty = Frame(comp.spark.createDataFrame([], DEAD_LETTER_STRUCT), None)
        for sink in d.sinks:
            schemas[id(sink)] = comp.branch(d.side, empty).frame(sink.inputs[0]).df.schema
    streamed_sinks = _streamed(graph.sinks, detours)
    if fork is None:
        return CompiledJob(graph.sinks, comp.frame(streamed_sinks[0].inputs[0]), comp, None, schemas, detours)
    comp.frame(fork)
    streamed = comp.tagged.get(id(fork)) or comp.frames[id(fork)]
    for sink in streamed_sinks:  # check every branch against the split step's schema now, not mid-job
        schemas[id(sink)] = comp.branch(fork, Frame(streamed.df.limit(0), streamed.time)).frame(sink.inputs[0]).df.schema
    return CompiledJob(graph.sinks, streamed, comp, fork, schemas, detours)


def _streamed(sinks: list[SinkNode], detours: list[Detour]) -> list[SinkNode]:
    """The sinks written from the streaming query's own rows (not from a detour's spool)."""
    detoured = {id(s) for d in detours for s in d.sinks}
    return [s for s in sinks if id(s) not in detoured]


def _detour(comp: Compilation, side: SideOutputNode) -> Detour:
    from ember.runner.spark.spool import spool_dir

    return Detour(side, comp.graph.sinks_after(side), spool_dir(comp.checkpoint, side.inputs[0].name))


def _spark_message(exc: Exception) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:800]

