"""Compile a pipeline graph into one Spark Structured Streaming query.

The planner (planner.py) decides where the query's sinks split and which side
outputs detour; the translators (translators/, through the table in
compilation.py) build each step's DataFrame; this module puts them together
into a :class:`CompiledJob` and writes its micro-batches to the sinks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ember.graph.graph import Graph
from ember.graph.nodes import Node, SideOutputNode, SinkNode
from ember.job import EnvironmentConfig
from ember.runner.spark import translators  # noqa: F401 - fills TRANSLATORS
from ember.runner.spark.compilation import TRANSLATORS, Compilation, Frame, registry, translates
from ember.runner.spark.datasources import register_sources
from ember.runner.spark.deadletters import DEAD_LETTER_STRUCT
from ember.runner.spark.fenced_writes import SinkTarget
from ember.runner.spark.placement import reads_one_of
from ember.runner.spark.planner import Plan, plan
from ember.runner.spark.spool import clear_spool, read_spool
from ember.runner.spark.translators.fanout import FannedOut, fan_out
from ember.runner.spark.translators.parts import Parts
from ember.runner.spark.translators.sinks import check_sink, metric_readers, prepare_sink, sink_writer, write_batch

# Frame, Compilation and the table are re-exported: they were defined here before compilation.py.
__all__ = ["Frame", "Compilation", "CompiledJob", "TRANSLATORS", "translates", "registry", "compile_graph"]


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
    fanned: FannedOut | None = None  # a fan-out's shared operator: the split follows it (then fork is None)
    sink_schemas: dict[int, Any] = field(default_factory=dict)  # id(sink node) -> StructType of its rows
    detours: list[Detour] = field(default_factory=list)
    # The sinks written from the streaming query's own rows (not from a detour's spool).
    streamed_sinks: list[SinkNode] = field(default_factory=list)
    # With ``compilation.count_rows``: receives (batch id, rows per step) of the steps compiled per
    # micro-batch (after the split, and a detour's), once their sinks wrote.
    on_branch_counts: Callable[[int, dict[str, int]], None] | None = None
    # SQL steps on branches of their own and unrelated pipelines: the query's rows are the union
    # of theirs and the rest's (translators/parts.py), parted again per micro-batch.
    parts: Parts | None = None

    @property
    def df(self) -> Any:
        return self.frame.df

    @property
    def output_mode(self) -> str:
        return "append"

    @property
    def one_sink(self) -> bool:
        """The query's rows go to one sink, written without a split."""
        return self.fork is None and self.fanned is None and not self.detours and self.parts is None

    def writer(self) -> Any:
        """``writeStream`` for the job's sink(s)."""
        if self.one_sink:
            return sink_writer(self.sinks[0], self.df, self.target(self.sinks[0]))
        return self.df.writeStream.foreachBatch(self._fan_out)

    def metric_readers(self) -> dict[str, Callable[[int, dict[str, Any]], None]]:
        """Observed metric name -> the reader handing a batch's row to the sink Spark wrote
        natively (translators/sinks.py ``METRIC_READERS``), to call with each progress report."""
        return metric_readers(self.sinks[0]) if self.one_sink else {}

    def target(self, sink: SinkNode) -> Any:
        return SinkTarget(self.compilation.job_id, sink.name)

    def prepare_sinks(self) -> None:
        """Check or create every sink's target (tables, connections) before the job starts."""
        for sink in self.sinks:
            prepare_sink(sink, self.sink_schemas.get(id(sink), self.df.schema))

    def _fan_out(self, batch: Any, batch_id: int) -> None:
        """Every sink's branch on one micro-batch of the split step's rows."""
        streamed = self.streamed_sinks
        branches, detoured = [], {}
        if self.fork is None and self.fanned is None and self.parts is None:
            write_batch(streamed[0], batch, batch_id, self.target(streamed[0]))
        else:
            batch.persist()
            try:
                main, parted = (batch, []) if self.parts is None else self.parts.split(batch)
                seeds = [(node, Frame(rows, time)) for node, rows, time in parted]
                if self.fanned is not None:
                    branch = self.compilation.branch_from(self.fanned.branches(main) + seeds, counted=self.fanned.lanes)
                elif self.fork is not None:
                    branch = self.compilation.branch_from([(self.fork, Frame(main, self.frame.time)), *seeds])
                else:
                    branch = self.compilation.branch_from(seeds)
                for sink in streamed:
                    write_batch(sink, branch.frame(sink.inputs[0]).df, batch_id, self.target(sink))
                branches.append(branch)
            finally:
                batch.unpersist()
        for detour in self.detours:  # the streamed sinks ran the batch's tasks, which spooled these rows
            rows = read_spool(self.compilation.spark, detour.directory, batch_id)
            if rows is not None:
                branch = self.compilation.branch(detour.side, Frame(rows, None))
                for sink in detour.sinks:
                    write_batch(sink, branch.frame(sink.inputs[0]).df, batch_id, self.target(sink))
                branches.append(branch)
                if self.compilation.count_rows:  # the side output's rows: the spool's (few: dead letters)
                    detoured[detour.side.name] = rows.count()
            clear_spool(detour.directory, batch_id)
        if self.on_branch_counts is not None and self.compilation.count_rows:
            # Every step compiled in a branch is an input (or an input's ancestor) of a sink that
            # has written, so its observation is complete: get() does not wait.
            counts = {step: int(obs.get.get("rows") or 0) for b in branches for step, obs in (b.observations or {}).items()}
            self.on_branch_counts(batch_id, {**counts, **detoured})

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
    count_rows: bool = False,
) -> CompiledJob:
    """Translate ``graph`` (validated) for ``spark``; nothing starts running. ``count_rows``:
    count each step's output rows per micro-batch (``Compilation.count_rows``)."""
    register_sources(spark)
    for sink in graph.sinks:
        check_sink(sink)
    physical = plan(graph)
    comp = Compilation(graph, spark, config, job_name, checkpoint, end_of_input_marker, stop_marker, plan=physical,
                       count_rows=count_rows)
    detours = [Detour(side, physical.detoured_sinks(side), comp.layout.spool(side.inputs[0].name)) for side in physical.detours]
    comp.detoured = {id(d.side.inputs[0]): d.directory for d in detours}
    schemas = {}
    for d in detours:  # each detoured branch checked on the spooled rows' schema now, not mid-job
        empty = Frame(comp.spark.createDataFrame([], DEAD_LETTER_STRUCT), None)
        for sink in d.sinks:
            schemas[id(sink)] = comp.branch(d.side, empty).frame(sink.inputs[0]).df.schema
    streamed_sinks = list(physical.streamed_sinks)
    beside = {id(s) for b in physical.beside for s in b.sinks}
    ahead = [s for s in streamed_sinks if not reads_one_of(s, physical.sql_branches) and id(s) not in beside]
    parted = bool(physical.sql_branches or physical.beside)
    fanned, fork, main = _rest(comp, physical, ahead, schemas, split_one=parted)
    if not parted:
        assert main is not None  # (a job without parts beside it has a sink of its own rows)
        return CompiledJob(graph.sinks, main, comp, fork, fanned, schemas, detours, streamed_sinks)
    return _with_parts(graph, comp, physical, main, fork, fanned, schemas, detours, streamed_sinks)


def _rest(comp: Compilation, physical: Any, sinks: list[SinkNode], schemas: dict[int, Any],
          split_one: bool) -> tuple[FannedOut | None, Node | None, Frame | None]:
    """The query's rows for ``sinks`` (the job's streamed sinks but those of SQL branches): a
    fan-out's shared operator, the split step's, or one sink's — with ``split_one``, written as a
    split's (the SQL branches' rows join them); each sink's branch checked against their schema
    now, not mid-job. Returns the fan-out, the split step and the rows (None without sinks)."""
    if physical.fan_out is not None:
        fanned = fan_out(comp, physical.fan_out)
        for sink in sinks:
            schemas[id(sink)] = comp.branch_from(fanned.branches(fanned.frame.df.limit(0))).frame(sink.inputs[0]).df.schema
        return fanned, None, fanned.frame
    if not sinks:
        return None, None, None
    fork = physical.fork
    if fork is None and not split_one:
        return None, None, comp.frame(sinks[0].inputs[0])
    fork = fork if fork is not None else sinks[0].inputs[0]  # (one sink: its rows, written as a split's)
    comp.frame(fork)
    rows = comp.tagged.get(id(fork)) or comp.frames[id(fork)]
    for sink in sinks:
        schemas[id(sink)] = comp.branch(fork, Frame(rows.df.limit(0), rows.time)).frame(sink.inputs[0]).df.schema
    return None, fork, rows


def _with_parts(graph: Graph, comp: Compilation, physical: Plan, main: Frame | None, fork: Node | None,
                fanned: FannedOut | None, schemas: dict[int, Any], detours: list[Detour],
                streamed_sinks: list[SinkNode]) -> CompiledJob:
    """A job with parts beside the rest (translators/parts.py: SQL steps on branches of their
    own, unrelated pipelines): the rest of the job's rows (``main``, :func:`_rest`)
    unioned with the parts', every sink written per micro-batch; each part's sinks checked
    against its rows' schema now, not mid-job."""
    seeds: list[tuple[Node, Any, Any]] = []
    for sql in physical.sql_branches:
        seeds.append((sql, Frame(comp.frame(sql).df, None), tuple(graph.sinks_after(sql))))
    for part in physical.beside:
        frame = comp.frame(part.seed)
        seeds.append((part.seed, comp.tagged.get(id(part.seed)) or frame, part.sinks))
    for node, frame, sinks in seeds:
        for sink in sinks:
            empty = Frame(frame.df.limit(0), frame.time)
            schemas[id(sink)] = comp.branch_from([(node, empty)]).frame(sink.inputs[0]).df.schema
    parts, union = Parts.union(None if main is None else main.df, [(node, f.df, f.time) for node, f, _ in seeds])
    return CompiledJob(graph.sinks, Frame(union, None if main is None else main.time), comp, fork, fanned, schemas,
                       detours, streamed_sinks, parts=parts)
