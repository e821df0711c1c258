"""Physical choices for running a graph as one Spark streaming query.

The graph (ember.graph) says what the user declared; the planner decides how
Spark runs it, before any DataFrame is built, and refuses what Spark cannot run
exactly — naming the step. No Spark is needed here, so plans are tested without
a session.

- **Chains of stateful steps.** A keyed-runtime step (process function, Python
  window) may read another's output, through ``key_by``, filters, ``map`` and ``flat_map``;
  with several such steps each runs on ``transformWithStateInPandas`` (Spark runs
  one ``applyInPandasWithState`` per query), and event time flows between them as
  in Flink (docs/design/dataflow.md). A two-input step (co-process, broadcast
  state, window join) may read one stateful step's output on either input; a
  step reading two stateful streams is refused, naming it.
- **Split.** A job with several sinks runs as one query up to its *split* (the
  last step every sink reads from), and the steps after it on every micro-batch
  in ``foreachBatch``: those branches must be stateless.
- **Fan-out.** A keyed-runtime step whose output several keyed steps read runs its
  readers as lanes of one Spark operator, and the job splits after it (fan_out_plan.py).
- **Detours.** When the only obstacle to that is the dead letters of a stateless step
  (``parse_json``, ``map``, ``flat_map``, ``filter``; ``join_lookup``'s unmatched records)
  read beside a stateful step, the dead letters *detour*: spooled by the step's tasks and
  written from the spool after the micro-batch (spool.py).
- **Where each step runs** (Spark's native windows and joins, or Ember's keyed runtime):
  placement.py.
- **Lateness.** With a single Spark stateful operator, the query runs with Spark's
  "current watermark" late-row filter (``allowMultiple`` off) and Ember drops and
  counts late records before a native window itself (translators/windows.py):
  Flink's rule. A query with several (a keyed step and a native window) keeps
  Spark's filter, one batch behind, and Spark's count of aggregated rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ember.errors import PipelineError
from ember.graph.chaining import why_not_chained
from ember.graph.graph import STATEFUL, Graph, ancestors, components
from ember.graph.nodes import (
    CoProcessNode,
    IntervalJoinNode,
    KeyByNode,
    LookupJoinNode,
    MapBatchesNode,
    Node,
    SelectNode,
    SideOutputNode,
    SinkNode,
    SourceNode,
    SqlNode,
    UnionNode,
    WindowNode,
)
from ember.runner.spark.fan_out_plan import FanOut, SharedDeadLetters, fan_out_of, lane_inputs, root_fan_out
from ember.runner.spark.placement import (
    CARRIES_TIME,
    detours,
    native_join,
    native_window,
    reads_one_of,
    runtime_steps,
    spark_stateful_operators,
    sql_beside_steps,
    sql_branches,
    upstream_sql,
    upstream_sqls,
    upstream_steps,
)

__all__ = ["Plan", "Beside", "plan", "physical_notes", "job_fan_out", "main_graph", "beside_parts"]


def physical_notes(graph: Graph) -> Callable[[Node], str]:
    """How each window step runs and which steps are a fan-out's lanes, for ``explain`` ("" for
    other steps: they say it themselves)."""

    try:
        fan = job_fan_out(graph)
    except PipelineError:
        fan = None  # explained as declared; plan() says why it cannot run

    def note(node: Node) -> str:
        how = ""
        if isinstance(node, WindowNode):
            how = "native" if native_window(node, graph) else "python, keyed state"
        elif isinstance(node, IntervalJoinNode):
            how = "native" if native_join(node, graph) else "python, keyed state"
        elif isinstance(node, KeyByNode) and node.reinterpret:  # a chained one is gone from the graph
            how = f"not chained: {why_not_chained(node, graph)}; a key_by"
        where = fan.where(node) if fan is not None else None
        if where is not None:
            level, lane = where
            shared = (f"lane {lane} of the Spark operator shared by the steps reading '{fan.source.name}'" if level == 0  # type: ignore[union-attr]
                      else f"lane {lane} of the fan-out's level-{level} operator")
            how = f"{how}; {shared}" if how else shared
        return how

    return note



@dataclass(frozen=True)
class Beside:
    """A pipeline unrelated to the rest of the job (its own sources, steps and sinks) that
    plans as a plain split (planner.main_part): its rows up to ``seed`` (where its sinks split,
    or its one sink's input; stateful steps before it) run beside the rest's in the one
    streaming query, and its ``sinks`` are written from them per micro-batch
    (translators/parts.py)."""

    seed: Node
    sinks: tuple[SinkNode, ...]


@dataclass(frozen=True)
class Plan:
    """How a graph runs: where its sinks split (None for one streamed sink), which
    side outputs detour, which sinks are written from the query's own rows, and
    the fan-out of a stateful step into several readers, if any (then ``fork`` is None)."""

    graph: Graph
    fork: Node | None
    detours: tuple[SideOutputNode, ...] = ()
    streamed_sinks: tuple[SinkNode, ...] = field(default=())
    fan_out: FanOut | None = None
    # SQL steps on branches of their own (sql_branches): each query runs beside the rest of the
    # job in the streaming query, its rows joining the split's (compiler.py); their sinks are
    # among ``streamed_sinks``.
    sql_branches: tuple[SqlNode, ...] = ()
    # Pipelines unrelated to the rest of the job, run beside it in the query (Beside, main_part);
    # their sinks are among ``streamed_sinks``.
    beside: tuple[Beside, ...] = ()

    def detoured_sinks(self, side: SideOutputNode) -> list[SinkNode]:
        return self.graph.sinks_after(side)

    @property
    def chained(self) -> bool:
        """Whether the job has several steps on Ember's keyed runtime, or a fan-out: Spark runs one
        ``applyInPandasWithState`` per query but chains ``transformWithStateInPandas``,
        so then every such step runs on the latter (keyed/tws.py) — as does a step a SQL
        step reads, or that reads a SQL step (placement.sql_beside_steps). Which operator a
        job's keyed steps run on: placement.spark_keyed_operator."""
        return len(runtime_steps(self.graph)) > 1 or self.fan_out is not None or sql_beside_steps(self.graph)

    def upstream_step(self, node: Node) -> Node | None:
        """The keyed-runtime step whose output ``node`` (a keyed-runtime step) reads, if any
        (of a two-input step reading one on each input: the first's)."""
        direct = self.upstream_steps(node)
        return direct[0] if direct else None

    def upstream_steps(self, node: Node) -> list[Node]:
        """The keyed-runtime steps whose outputs ``node`` reads: one, one per input of a two-input
        step, or several merged by a union before a one-input step."""
        return upstream_steps(node, self.graph)

    def read_by_step(self, node: Node) -> bool:
        """Whether another keyed-runtime step, or a SQL step, reads ``node``'s output (it then
        emits each row's event time)."""
        readers = [*runtime_steps(self.graph), *(n for n in self.graph.nodes if isinstance(n, SqlNode))]
        return any(any(u is node for u in self.upstream_steps(n)) for n in readers if n is not node)

    @property
    def sql_beside_steps(self) -> bool:
        """Whether a SQL step reads a keyed-runtime step's output or one reads a SQL step's
        (placement.sql_beside_steps)."""
        return sql_beside_steps(self.graph)

    def upstream_sql(self, node: Node) -> Node | None:
        """The SQL step whose rows the keyed-runtime step ``node`` reads (placement.upstream_sql)."""
        return upstream_sql(node, self.graph)

    def read_by_step_after_sql(self, node: Node) -> bool:
        """Whether a keyed-runtime step reads the SQL step ``node``'s rows (each then carries
        its event time from the query's ``rowtime``: translators/sql.py)."""
        return any(any(s is node for s in upstream_sqls(n, self.graph)) for n in runtime_steps(self.graph))

    def lane(self, node: Node) -> bool:
        """Whether ``node`` runs as a lane of a fan-out's shared operator (translators/fanout.py)."""
        return self.fan_out is not None and self.fan_out.where(node) is not None

    def lane_inputs(self, node: Node) -> tuple[int, ...]:
        """For a two-input step running as a lane of the fan-out: which of its inputs read the
        fanned-out rows, one or both (fan_out_plan.lane_inputs); () for any other step."""
        if self.fan_out is None or self.fan_out.where(node) is None or len(node.inputs) != 2:
            return ()
        return lane_inputs(node, self.fan_out.stem)

    def native(self, node: WindowNode) -> bool:
        return native_window(node, self.graph)

    def native_join(self, node: IntervalJoinNode) -> bool:
        return native_join(node, self.graph)

    @property
    def late_rows_against_current_watermark(self) -> bool:
        """Whether the query runs Spark's late-row filter with the current batch's watermark
        (``spark.sql.streaming.statefulOperator.allowMultiple`` off: possible with one
        stateful operator) rather than the previous batch's."""
        return len(spark_stateful_operators(self.graph)) == 1

    @property
    def spark_counts_late_rows(self) -> bool:
        """Whether the late rows Spark's stateful operators drop (``numRowsDroppedByWatermark``)
        count in the job's late records: unless the job's one stateful operator is a native
        window, which counts its late records itself (exactly, translators/windows.py) — a SQL
        step's aggregation has only Spark's count (of aggregated rows, docs/sql.md)."""
        if not self.late_rows_against_current_watermark:
            return True
        return isinstance(spark_stateful_operators(self.graph)[0], SqlNode)

    def drops_late_records(self, node: Node) -> bool:
        """Whether Ember drops and counts a native window's late records itself (Flink's rule)."""
        return isinstance(node, WindowNode) and native_window(node, self.graph) and self.late_rows_against_current_watermark


def plan(graph: Graph) -> Plan:
    """The physical plan of a validated ``graph``; raises :class:`PipelineError`
    for what one Spark query cannot run."""
    _check_chains(graph)
    parts = components(graph)
    if len(parts) > 1:  # (SQL branches of their own sources among them)
        _one_watermark([Graph(sinks) for sinks in parts])
    branches = sql_branches(graph)
    if branches:
        _check_sql_branches(graph, branches)
        two = next((n for n in runtime_steps(graph) if len(upstream_steps(n, graph)) > 1), None)
        if two is not None:  # (its operators are numbered walking the branches: restart.pipeline_manifest)
            raise PipelineError(
                f"the SQL step '{branches[0].name}' runs on a branch of its own beside the rest of the job, and "
                f"'{two.name}' reads several stateful steps; the two together are not supported yet: run the SQL "
                "step as its own job", branches[0].name,
            )
        return _with_sql_branches(graph, branches)
    if len(parts) > 1:
        return _with_beside(graph)
    fan = job_fan_out(graph)
    if fan is not None:
        sql = next((n for n in graph.nodes if isinstance(n, SqlNode)), None)
        if sql is not None and sql_beside_steps(graph):
            raise PipelineError(
                f"the job's rows part into several readers (a fan-out: docs/design/dataflow.md) and the SQL step "
                f"'{sql.name}' reads keyed steps or is read by one; a SQL step in a fan-out is not supported yet: give "
                "it (and the steps it reads) one reader, or run that part as its own job", sql.name,
            )
        detoured = {id(s) for d in fan.detours for s in graph.sinks_after(d)}
        return Plan(graph, None, fan.detours, tuple(s for s in graph.sinks if id(s) not in detoured), fan)
    fork, detours, streamed = _split(graph)
    return Plan(graph, fork, tuple(detours), tuple(streamed))


def _check_sql_branches(graph: Graph, branches: tuple[SqlNode, ...]) -> None:
    """Refuses a SQL branch (placement.sql_branches) whose rows meet other rows after the
    query, naming the step."""
    for node in branches:
        after = [n for n in graph.nodes if any(a is node for a in ancestors(n))]
        inside = {id(node)} | {id(n) for n in after}
        for n in after:
            foreign = next((p for p in n.inputs if id(p) not in inside), None)
            if foreign is not None:
                raise PipelineError(
                    f"'{n.name}' reads the rows of the SQL step '{node.name}', which runs on a branch of its own "
                    f"beside the rest of the job, and those of '{foreign.name}' too; there a SQL step's rows meet no "
                    "other rows (yet): read them into sinks of their own", n.name,
                )


def main_graph(graph: Graph, branches: tuple[SqlNode, ...]) -> Graph | None:
    """The job without its SQL branches (:func:`sql_branches`) and their sinks; None when every
    sink reads one."""
    sinks = [s for s in graph.sinks if not reads_one_of(s, branches)]
    return Graph(sinks) if sinks else None


def _with_sql_branches(graph: Graph, branches: tuple[SqlNode, ...]) -> Plan:
    """The plan of a job with SQL branches: the rest of the job planned alone (split, fan-out),
    every sink written per micro-batch from the query's rows."""
    main = main_graph(graph, branches)
    fork: Node | None = None
    detours: tuple[SideOutputNode, ...] = ()
    streamed: tuple[SinkNode, ...] = ()
    fan: FanOut | None = None
    beside: tuple[Beside, ...] = ()
    if main is not None:
        inner = plan(main)
        fork, detours, streamed, fan, beside = inner.fork, inner.detours, inner.streamed_sinks, inner.fan_out, inner.beside
    after = tuple(s for s in graph.sinks if reads_one_of(s, branches))
    return Plan(graph, fork, detours, (*streamed, *after), fan, branches, beside)


def main_part(graph: Graph) -> tuple[tuple[Graph, Plan], list[tuple[Graph, Plan]]]:
    """A job of several unrelated pipelines (graph.components) parted, each with its plan as a
    job alone: the main one — the one that needs more than a plain split (a fan-out, detours,
    SQL branches, a step reading several stateful steps), else the first holding stateful
    steps, else the first — and the others, each run beside it in the one streaming query up to
    where its sinks split. Refuses, naming a step of each: two pipelines that both need more
    than a plain split, and two whose stateful steps both follow a watermark
    (:func:`_watermarked`): Spark's is one per query, the least of its inputs', so a slow or idle
    pipeline would hold back the other's windows and timers and let in records Flink would
    judge late."""
    parts = [Graph(sinks) for sinks in components(graph)]
    _one_watermark(parts)
    alone = {id(p): plan(p) for p in parts}
    stateful = [p for p in parts if any(isinstance(n, STATEFUL) for n in p.nodes)]
    special = [p for p in stateful if not _plain(p, alone[id(p)])]
    if len(special) > 1:
        step = next(n for n in special[1].nodes if isinstance(n, STATEFUL))
        raise PipelineError(
            f"the sinks {_names(special[0])} and {_names(special[1])} read from unrelated pipelines that both need "
            "more than one split of their rows (a fan-out into several keyed readers, dead letters that detour, "
            "a SQL branch or a step reading several stateful steps); one such pipeline runs beside others, not "
            "two: execute one of them as its own job", step.name,
        )
    main = special[0] if special else (stateful[0] if stateful else parts[0])
    return (main, alone[id(main)]), [(p, alone[id(p)]) for p in parts if p is not main]


def beside_parts(graph: Graph) -> list[Graph]:
    """The unrelated pipelines that run beside the rest of the job (:func:`main_part`; SQL
    branches aside), in the order their rows join the query's (after the SQL branches')."""
    branches = sql_branches(graph)
    main = main_graph(graph, branches) if branches else graph
    if main is None or len(components(main)) < 2:
        return []
    return [part for part, _ in main_part(main)[1]]


def _one_watermark(parts: list[Graph]) -> None:
    """Refuses unrelated pipelines (``parts``) of which two have stateful steps following a
    watermark (:func:`_watermarked`), naming them (:func:`main_part`)."""
    timed = [(p, step) for p in parts if (step := _watermarked(p)) is not None]
    if len(timed) > 1:
        (a, first), (b, second) = timed[:2]
        raise PipelineError(
            f"the sinks {_names(a)} and {_names(b)} read from unrelated pipelines whose stateful steps both follow a "
            f"watermark ('{first.name}', '{second.name}'); in one Spark query they would share one watermark (the "
            "least of the two), so either could hold back the other's windows and timers: execute each as its own "
            "job (beside one such pipeline, unrelated ones run whose steps hold no state or follow no event time: "
            "process functions on processing time, rolling aggregations)", second.name,
        )


def _names(part: Graph) -> str:
    return ", ".join(s.name for s in part.sinks)


def _watermarked(part: Graph) -> Node | None:
    """A stateful step of ``part`` that follows Spark's watermark (None: none does): a step
    reading a source with an event-time strategy, or a processing-time window (its watermark
    is the batch time). Keyed steps without event time run on processing-time timers, which
    no watermark moves."""
    for node in part.nodes:
        if not isinstance(node, STATEFUL):
            continue
        if isinstance(node, WindowNode) and getattr(node.assigner, "processing_time", False):
            return node
        if any(isinstance(a, SourceNode) and a.watermark is not None and a.watermark.timestamp_field is not None
               for a in ancestors(node)):
            return node
    return None


def _plain(part: Graph, alone: Plan) -> bool:
    """Whether ``part``, planned alone (``alone``), is a plain split of one query's rows: no
    fan-out, no detours, no SQL branches, no step reading several stateful steps (numbered by
    a walk of the whole graph: restart.pipeline_manifest)."""
    return (alone.fan_out is None and not alone.detours and not alone.sql_branches
            and not any(len(upstream_steps(n, part)) > 1 for n in runtime_steps(part)))


def _with_beside(graph: Graph) -> Plan:
    """The plan of a job of several unrelated pipelines (:func:`main_part`): the main one planned
    alone, each other one split after its last shared step (or read at its one sink's input)."""
    (_, inner), others = main_part(graph)
    beside = [Beside(alone.fork or part.sinks[0].inputs[0], tuple(part.sinks)) for part, alone in others]
    streamed = (*inner.streamed_sinks, *(s for b in beside for s in b.sinks))
    return Plan(graph, inner.fork, inner.detours, streamed, inner.fan_out, inner.sql_branches, (*inner.beside, *beside))


def job_fan_out(graph: Graph) -> FanOut | None:
    """The job's fan-out (fan_out_plan.py), or None — also when a stateful step's only other
    reader is a dead-letter output that detours (a ``map`` with dead letters between two keyed
    steps, say); raises :class:`PipelineError` for a fan-out this runner cannot run, naming it.
    A job that cannot run otherwise may fan out before its first keyed steps (root_fan_out):
    a stream read by several keyed steps, or by one and by a sink of its raw records. Dead
    letters of steps on a lane's own path detour (``FanOut.detours``)."""
    branches = sql_branches(graph)
    if branches:  # the fan-out of the rest of the job, beside them
        main = main_graph(graph, branches)
        return None if main is None else job_fan_out(main)
    if len(components(graph)) > 1:  # the fan-out of the pipeline holding state, beside the others
        return main_part(graph)[0][1].fan_out
    try:
        fan = _with_detours(graph, fan_out_of)
    except PipelineError:
        root = _with_detours(graph, root_fan_out)
        if root is None:
            raise
        return root
    if fan is not None:
        return fan
    try:
        _split(graph)
    except PipelineError:
        return _with_detours(graph, root_fan_out)  # None: plan() raises the split's problem
    return None


def _with_detours(graph: Graph, find: Callable[[Graph, frozenset[int]], FanOut | None]) -> FanOut | None:
    """``find(graph, ignore)`` (fan_out_plan's ``fan_out_of`` or ``root_fan_out``) — or, when it
    refuses the job, the fan-out it finds with the dead-letter outputs that may detour left out
    of the readers: None (the job may split with detours: planner._split), or a fan-out whose
    lanes' paths send dead letters beside the query (``FanOut.detours``, each checked as
    :func:`_split` checks a detour). The first refusal stands when neither works."""
    try:
        return find(graph, frozenset())
    except PipelineError as problem:
        detourable = frozenset(id(n) for n in _detourable(graph))
        if not detourable:
            raise
        try:
            fan = find(graph, detourable)
            if fan is not None:  # only its own detours left out: what it needs, checked
                own = frozenset(id(d) for d in fan.detours)
                if not own:  # (a fan-out all the same: the refusal stands)
                    raise problem
                fan = find(graph, own)
                if fan is None or frozenset(id(d) for d in fan.detours) != own:
                    raise problem
                if any(_check_detour(graph, side) is not None for side in fan.detours):
                    raise problem
        except SharedDeadLetters:
            raise
        except PipelineError:
            raise problem from None
        return fan


def _detourable(graph: Graph) -> list[SideOutputNode]:
    """The dead-letter outputs of stateless steps: they may leave the query beside it (spool.py)."""
    return [n for n in graph.nodes if detours(n)]


def _split(graph: Graph) -> tuple[Node | None, list[SideOutputNode], list[SinkNode]]:
    """Where a job with several sinks splits, and which outputs leave the query beside it.

    The split (``fork``) is the last step every sink reads from whose followers all
    read from it or from each other. Ember runs the graph up to it as one streaming
    query and the steps after it on every micro-batch, so those must be stateless
    (None for a job with one sink).

    When that would put a stateful step after the split only because the job also
    reads the dead letters of a stateless step (``parse_json`` decoding JSON for a window,
    a ``map`` parsing records between two keyed steps, say), those dead letters
    *detour*: the step's tasks spool them beside the query per micro-batch, and their
    (stateless) branch is written from the spool after the micro-batch's other sinks.
    Returns the split, the detoured side outputs and the sinks written from the query's
    own rows."""
    try:
        return _fork(graph, graph.sinks), [], graph.sinks
    except PipelineError as problem:
        detours = _detourable(graph)
        detoured = {id(s) for d in detours for s in graph.sinks_after(d)}
        rest = [s for s in graph.sinks if id(s) not in detoured]
        if not detours or not rest:
            raise
        for d in detours:
            if _check_detour(graph, d) is not None:
                raise problem from None
        return _fork(graph, rest), detours, rest


def _check_detour(graph: Graph, d: SideOutputNode) -> PipelineError | None:
    """A detour is a stateless branch of its own, from the side output ``d`` to its sinks:
    returns why its steps cannot run so (None: they can); raises when one of them reads
    something else too."""
    branch = [n for n in graph.nodes if id(d) in {id(a) for a in ancestors(n)} and not isinstance(n, SinkNode)]
    problem = _branch_problem(branch, {id(a) for a in ancestors(d)} | {id(d)}, d, d.name)
    if problem is not None:
        return problem
    inside = {id(n) for n in branch} | {id(d)}
    for node in branch:
        foreign = next((p for p in node.inputs if id(p) not in inside), None)
        if foreign is not None:
            other = (f"the side output '{foreign.tag.name}' of '{foreign.inputs[0].name}'"
                     if isinstance(foreign, SideOutputNode) else f"'{foreign.name}'")
            raise PipelineError(
                f"'{node.name}' reads the dead letters of '{d.inputs[0].name}', which leave the query beside "
                f"it (a detour: its records feed a stateful step), and {other} too; read each such "
                "dead-letter output into its own sink(s)", node.name,
            )
    return None


def _fork(graph: Graph, sinks: list[SinkNode]) -> Node | None:
    if len(sinks) < 2:
        return None
    shared: set[int] | None = None
    for sink in sinks:
        upstream = {id(n) for n in ancestors(sink)}
        shared = upstream if shared is None else shared & upstream
    names = ", ".join(s.name for s in sinks)
    feeding = {id(n) for s in sinks for n in ancestors(s)}
    common = [n for n in graph.nodes if id(n) in (shared or set())]
    if not common:
        raise PipelineError(f"the sinks {names} read from unrelated pipelines; execute each as its own job")
    # The latest shared step after which every step is stateless and reads only
    # from it or from steps after it (a branch may also read a side output of a
    # step between the split and its sink, e.g. dead letters of several steps).
    problem: PipelineError | None = None
    for fork in reversed(common):
        before = {id(n) for n in ancestors(fork)} | {id(fork)}
        branch = [n for n in graph.nodes if id(n) not in before and id(n) in feeding and not isinstance(n, SinkNode)]
        problem = _branch_problem(branch, before, fork, names)
        if problem is None:
            return fork
        if any(isinstance(n, (*STATEFUL, SourceNode)) for n in branch):
            break  # an earlier split would only put more state after it
    if problem is None:  # not reached: the loop returns or sets a problem
        raise PipelineError(f"the sinks {names} have no step to split at")
    raise problem


def _branch_problem(branch: list[Node], before: set[int], fork: Node, names: str) -> PipelineError | None:
    """Why the steps ``branch`` cannot run per micro-batch after a split at ``fork`` (None: they can)."""
    for node in branch:
        if isinstance(node, (*STATEFUL, SourceNode)):
            return PipelineError(
                f"'{node.name}' ({node.kind}) comes after the point where the job's sinks ({names}) split at "
                f"'{fork.name}'; steps after the split run per micro-batch and must be stateless: move it before "
                "the split, or run that branch as its own job",
                node.name,
            )
        for parent in node.inputs:
            if id(parent) in before and parent is not fork:
                return PipelineError(
                    f"'{node.name}' reads '{parent.name}', before the split at '{fork.name}'; after the split "
                    "every branch must start from that one step",
                    node.name,
                )
    return None


def _check_chains(graph: Graph) -> None:
    """A keyed-runtime step reads another (a chain), one per input (a two-input step), or
    several through a union (a one-input step: every path from them merges at a union
    before it); the steps between keep the rows' event time: key_by, filters, Python map /
    flat_map, map_batches (one row per input row), select and join_lookup, which pass each
    output row on with its input record's hidden event-time columns, side outputs and unions.
    A SQL step reading keyed-runtime steps, and a keyed-runtime step reading a SQL step, are
    held to the same rule (each view's rows carry their time: translators/sql.py)."""
    for node in [*runtime_steps(graph), *(n for n in graph.nodes if isinstance(n, SqlNode))]:
        direct = upstream_steps(node, graph)
        if not isinstance(node, SqlNode):
            direct = [*direct, *upstream_sqls(node, graph)]
        if len(direct) > 1 and not isinstance(node, SqlNode) and not _one_per_input(node, direct) \
                and len(node.inputs) != 1:
            raise PipelineError(
                f"'{node.name}' reads the outputs of several stateful steps ({', '.join(a.name for a in direct)}) "
                "and one of them on both its inputs; a two-input step may read stateful steps (one, or several "
                "unioned) on each input, each step on one input only, yet: run one part as its own job",
                node.name,
            )
        for upstream in direct:
            between = [a for a in ancestors(node) if any(b is upstream for b in ancestors(a))]
            for step in between:
                if isinstance(step, SideOutputNode) and step.inputs[0] is not upstream:
                    raise PipelineError(
                        f"'{node.name}' reads the side output '{step.tag.name}' of '{step.inputs[0].name}', a step between "
                        f"it and the stateful step '{upstream.name}'; a keyed step reads side outputs of keyed steps "
                        "only, yet", step.name,
                    )
                if not isinstance(step, (*CARRIES_TIME, UnionNode, SelectNode, LookupJoinNode, MapBatchesNode)):
                    raise PipelineError(
                        f"'{step.name}' ({step.kind}) sits between the stateful steps '{upstream.name}' and "
                        f"'{node.name}'; between two stateful steps only key_by, filter, map, flat_map, map_batches, select, join_lookup, "
                        "union and a side output are "
                        "supported yet (a step there must pass each record's event time on): move it before "
                        f"'{upstream.name}' or into its function",
                        step.name,
                    )


def _one_per_input(node: Node, direct: list[Node]) -> bool:
    """Whether ``node`` is a two-input step whose inputs read the stateful steps ``direct``
    apart: each step on one input only (one, or several merged by a union there), so each
    input's rows carry their own steps' event time."""
    if not isinstance(node, CoProcessNode | IntervalJoinNode) or len(node.inputs) != 2:
        return False
    per_input = [{id(a) for a in direct if a is i or any(a is b for b in ancestors(i))} for i in node.inputs]
    return not per_input[0] & per_input[1] and len(per_input[0] | per_input[1]) == len(direct)
