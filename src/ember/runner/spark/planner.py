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
- **Fan-out.** A keyed-runtime step whose output several keyed steps read (or
  keyed steps and sinks) would be planned once per reader in a Spark query, which
  is a tree. Its readers run instead as *lanes* of one ``transformWithStateInPandas``
  operator (keyed/lanes.py): each row goes to every lane that reads it, grouped by
  ``(lane, state bucket)``, and the job splits after that operator (:class:`FanOut`).
- **Detours.** When the only obstacle to that is a ``parse_json`` step's dead
  letters read beside a stateful step, the dead letters *detour*: spooled by the
  decoding step and written from the spool after the micro-batch (spool.py).
- **Windows.** A window runs on Spark's native windowing (``groupBy(window(...))``,
  in the JVM) when Spark's semantics are Flink's for it: built-in aggregates on a
  tumbling or sliding window, or a processing-time session window, with the default
  trigger and nothing else (``WindowNode.plain``), and no other stateful step on its path. An event-time session window runs
  on Ember's operator: Spark cannot merge a record behind the watermark into a
  session that is still open (Flink does), it drops it. Every other window runs on
  Ember's window operator over keyed state (runner/spark/keyed/windows).
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
from ember.graph.graph import STATEFUL, Graph, ancestors
from ember.graph.nodes import (
    CoProcessNode,
    FilterNode,
    FlatMapNode,
    IntervalJoinNode,
    KeyByNode,
    KeyedProcessNode,
    MapNode,
    Node,
    ParseJsonNode,
    SideOutputNode,
    SinkNode,
    SourceNode,
    SqlNode,
    VectorizedProcessNode,
    WindowNode,
)

__all__ = ["Plan", "FanOut", "Level", "plan", "fan_out_of", "native_window", "native_join", "physical_notes",
           "spark_stateful_operators", "runtime_steps", "upstream_steps"]

# Steps that pass each row on with its event time (hidden columns, translators/eventtime.py);
# a keyed step's side output carries each record's too.
_CARRIES_TIME = (KeyByNode, FilterNode, MapNode, FlatMapNode, SideOutputNode)


def native_window(node: WindowNode, graph: Graph) -> bool:
    """Whether the window step runs on Spark's native windowing (else on Ember's window operator).

    Native only when Spark's semantics are Flink's (``node.plain``) and the window is the
    only stateful step on its path: a window reading or feeding another stateful step runs
    on Ember's operator, where event time flows between steps as in Flink."""
    return node.plain and _only_stateful_step_on_its_path(node, graph)


def native_join(node: IntervalJoinNode, graph: Graph) -> bool:
    """Whether the interval join runs on Spark's native stream-stream join: when no other
    stateful step comes before or after it (Spark's join rows have no Ember event time, and
    Ember's steps carry theirs in hidden columns); else on Ember's keyed runtime as a
    co-process step, where event time flows between steps as in Flink."""
    return _only_stateful_step_on_its_path(node, graph)


def _only_stateful_step_on_its_path(node: Node, graph: Graph) -> bool:
    """Whether no stateful step comes before ``node`` or after it."""
    return not any(isinstance(n, STATEFUL) for n in ancestors(node)) and not any(
        isinstance(n, STATEFUL) and any(a is node for a in ancestors(n)) for n in graph.nodes
    )


def spark_stateful_operators(graph: Graph) -> list[Node]:
    """The steps Spark runs as stateful operators: native windows and keyed-state steps."""
    return [n for n in graph.nodes if isinstance(n, STATEFUL)]


def runtime_steps(graph: Graph) -> list[Node]:
    """The steps on Ember's keyed runtime (process functions, Python windows), in graph order."""
    return [n for n in graph.nodes if _keyed_state(n, graph)]


def _keyed_state(node: Node, graph: Graph) -> bool:
    """Whether the step runs on Ember's keyed state (a Spark Python state operator)."""
    if isinstance(node, WindowNode):
        return not native_window(node, graph)
    if isinstance(node, IntervalJoinNode):
        return not native_join(node, graph)
    return isinstance(node, KeyedProcessNode | VectorizedProcessNode)


def physical_notes(graph: Graph) -> Callable[[Node], str]:
    """How each window step runs and which steps are a fan-out's lanes, for ``explain`` ("" for
    other steps: they say it themselves)."""

    try:
        fan = fan_out_of(graph)
    except PipelineError:
        fan = None  # explained as declared; plan() says why it cannot run

    def note(node: Node) -> str:
        how = ""
        if isinstance(node, WindowNode):
            how = "native" if native_window(node, graph) else "python, keyed state"
        elif isinstance(node, IntervalJoinNode):
            how = "native" if native_join(node, graph) else "python, keyed state"
        where = fan.where(node) if fan is not None else None
        if where is not None:
            level, lane = where
            shared = (f"lane {lane} of the Spark operator shared by the steps reading '{fan.source.name}'" if level == 0  # type: ignore[union-attr]
                      else f"lane {lane} of the fan-out's level-{level} operator")
            how = f"{how}; {shared}" if how else shared
        return how

    return note


@dataclass(frozen=True)
class FanOut:
    """A keyed-runtime step (``source``) whose output several readers take: the keyed
    steps reading it (``lanes``, each through ``key_by`` and filters only after the
    ``stem``: ``paths``) run as lanes of one Spark operator, and ``through`` says whether
    other branches (sinks, through stateless steps) read the stem's rows too — they then
    pass the operator on a lane of their own. The job splits after that operator: the lanes' outputs (and
    ``source``'s, with ``through``) start its stateless branches."""

    source: Node
    lanes: tuple[Node, ...]
    paths: tuple[tuple[Node, ...], ...]  # per lane: the steps between the stem and it, in graph order
    through: bool
    stem: Node  # where the rows fan out: source, or the last step after it that every reader passes
    # Keyed steps reading the lanes, level by level: each level one more shared operator, whose
    # lanes read lanes of the level before (``Level``); that level's rows pass it packed.
    after: tuple["Level", ...] = ()

    @property
    def seeds(self) -> tuple[Node, ...]:
        """The steps whose rows the branches after the split start from."""
        return self.lanes + ((self.stem,) if self.through else ())

    @property
    def levels(self) -> tuple[tuple[Node, ...], ...]:
        """Every level's lanes: the first level's (reading the stem), then ``after``'s."""
        return (self.lanes, *(level.lanes for level in self.after))

    def where(self, node: Node) -> tuple[int, int] | None:
        """(level, lane) of a keyed step running as a lane, else None."""
        for k, lanes in enumerate(self.levels):
            for i, lane in enumerate(lanes):
                if lane is node:
                    return k, i
        return None


@dataclass(frozen=True)
class Level:
    """Keyed steps of a fan-out reading the lanes of the level before (``reads``: per lane,
    the lane it reads there and which of its outputs — None for the main one, else a side
    output's tag; through ``key_by`` only)."""

    lanes: tuple[Node, ...]
    reads: tuple[tuple[int, str | None], ...]


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

    def detoured_sinks(self, side: SideOutputNode) -> list[SinkNode]:
        return self.graph.sinks_after(side)

    @property
    def chained(self) -> bool:
        """Whether the job has several steps on Ember's keyed runtime: Spark runs one
        ``applyInPandasWithState`` per query but chains ``transformWithStateInPandas``,
        so then every such step runs on the latter (keyed/tws.py)."""
        return len(runtime_steps(self.graph)) > 1

    def upstream_step(self, node: Node) -> Node | None:
        """The keyed-runtime step whose output ``node`` (a keyed-runtime step) reads, if any
        (of a two-input step reading one on each input: the first's)."""
        direct = self.upstream_steps(node)
        return direct[0] if direct else None

    def upstream_steps(self, node: Node) -> list[Node]:
        """The keyed-runtime steps whose outputs ``node`` reads: one, or one per input of a two-input step."""
        return upstream_steps(node, self.graph)

    def read_by_step(self, node: Node) -> bool:
        """Whether another keyed-runtime step reads ``node``'s output (it then emits event time)."""
        return any(any(u is node for u in self.upstream_steps(n)) for n in runtime_steps(self.graph) if n is not node)

    def lane(self, node: Node) -> bool:
        """Whether ``node`` runs as a lane of a fan-out's shared operator (translators/fanout.py)."""
        return self.fan_out is not None and self.fan_out.where(node) is not None

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

    def drops_late_records(self, node: Node) -> bool:
        """Whether Ember drops and counts a native window's late records itself (Flink's rule)."""
        return isinstance(node, WindowNode) and native_window(node, self.graph) and self.late_rows_against_current_watermark


def plan(graph: Graph) -> Plan:
    """The physical plan of a validated ``graph``; raises :class:`PipelineError`
    for what one Spark query cannot run."""
    _check_chains(graph)
    _check_alone(graph)
    fan = fan_out_of(graph)
    if fan is not None:
        return Plan(graph, None, (), tuple(graph.sinks), fan)
    fork, detours, streamed = _split(graph)
    return Plan(graph, fork, tuple(detours), tuple(streamed))


def _readers(graph: Graph) -> dict[int, list[Node]]:
    """Step -> the steps reading it directly."""
    out: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for parent in node.inputs:
            out.setdefault(id(parent), []).append(node)
    return out


def fan_out_of(graph: Graph) -> FanOut | None:
    """The job's fan-out (:class:`FanOut`), None when no keyed-runtime step's output is
    read by a keyed step and by another reader; raises :class:`PipelineError` for a
    fan-out this runner cannot run yet, naming the step."""
    readers = _readers(graph)
    steps = runtime_steps(graph)
    candidates = []
    for source in steps:
        lanes = tuple(n for n in steps if n is not source and upstream_steps(n, graph) == [source])
        if not lanes:
            continue
        lane_ids = {id(n) for n in lanes}
        reached, stack = set(), [source]  # what reads source's rows without passing a lane
        while stack:
            for reader in readers.get(id(stack.pop()), []):
                if id(reader) not in lane_ids and id(reader) not in reached:
                    reached.add(id(reader))
                    stack.append(reader)
        through = any(id(s) in reached for s in graph.sinks)
        if len(lanes) > 1 or through:
            candidates.append((source, lanes, through))
    if not candidates:
        return None
    # The first fan-out; the steps after its lanes (a fan-out of a lane included) run as further
    # levels of lanes below.
    top = [c for c in candidates if not any(o[0] is a for o in candidates for a in ancestors(c[0]))]
    if len(top) > 1:
        names = ", ".join(f"'{c[0].name}'" for c in top)
        raise PipelineError(
            f"the outputs of several stateful steps ({names}) on separate branches are each read by more than one "
            "step; a job fans out after one stateful step only, yet: run the rest as its own job", top[1][0].name
        )
    source, lanes, through = top[0]
    for lane in lanes:
        if isinstance(lane, CoProcessNode | IntervalJoinNode):
            raise PipelineError(
                f"'{lane.name}' ({lane.kind}) is one of several steps reading '{source.name}'; a two-input step "
                "there is not supported yet (its other input would have to join the shared operator): give "
                f"'{source.name}' one reader, or run that part as its own job", lane.name,
            )
    stem = _stem(graph, source, lanes, readers)
    paths = []
    for lane in lanes:
        path = _between(graph, stem, lane)
        side = isinstance(path[0], SideOutputNode) and path[0].inputs[0] is stem
        mapped = False  # a lane's own map / flat_map: one, after its filters (translators/fanout.py)
        for step in path[1:] if side else path:
            if isinstance(step, KeyByNode):
                continue
            plain = not side and not mapped and getattr(step, "dead_letter", None) is None
            if plain and isinstance(step, MapNode | FlatMapNode):
                mapped = True
            elif not (plain and isinstance(step, FilterNode)):
                raise PipelineError(
                    f"'{step.name}' ({step.kind}) sits between the stateful step '{source.name}' and '{lane.name}', "
                    f"one of several steps reading '{source.name}'; after the point where they part only filters, "
                    "then one map or flat_map, then key_by are supported yet (without dead letters; on a side "
                    f"output, key_by only): let every reader share it (one step before they part), move it before "
                    f"'{source.name}', or into a function", step.name,
                )
        paths.append(path)
    after = _levels(graph, source, lanes)
    every_lane = [lane for level in (lanes, *(lv.lanes for lv in after)) for lane in level]
    for node in graph.nodes:
        stateful = isinstance(node, (*STATEFUL, SourceNode))
        if stateful and node is not source and not any(node is a for a in ancestors(source)) \
                and not any(node is lane for lane in every_lane):
            raise PipelineError(
                f"'{node.name}' ({node.kind}) is on a branch of its own beside the fan-out after '{source.name}'; "
                "a job that fans out after a stateful step reads it in every branch, yet: run that branch as "
                "its own job", node.name,
            )
    for sink in graph.sinks:
        if not any(a is source for a in ancestors(sink)):
            raise PipelineError(
                f"the sink '{sink.name}' does not read the output of '{source.name}', after which the job fans "
                "out; every sink of such a job must (yet): run that branch as its own job", sink.name,
            )
    return FanOut(source, lanes, tuple(paths), through, stem, after)


def _between(graph: Graph, upstream: Node, node: Node) -> tuple[Node, ...]:
    """The steps after ``upstream`` that ``node`` reads through, in graph order."""
    return tuple(a for a in graph.nodes if any(b is upstream for b in ancestors(a)) and any(a is b for b in ancestors(node)))


def _levels(graph: Graph, source: Node, lanes: tuple[Node, ...]) -> tuple[Level, ...]:
    """The keyed steps after a fan-out's first lanes, level by level (:class:`Level`)."""
    levels: list[Level] = []
    previous = lanes
    rest = [n for n in runtime_steps(graph) if any(a is source for a in ancestors(n)) and not any(n is lane for lane in lanes)]
    while rest:
        level, reads = [], []
        for node in rest:
            direct = upstream_steps(node, graph)
            if len(direct) > 1:
                raise PipelineError(
                    f"'{node.name}' reads two stateful steps ({', '.join(a.name for a in direct)}) after the fan-out "
                    f"after '{source.name}'; a two-input step there is not supported yet: run that part as its own job",
                    node.name,
                )
            upstream = direct[0]
            j = next((j for j, lane in enumerate(previous) if lane is upstream), None)
            if j is None:
                continue
            path = _between(graph, upstream, node)
            side = path[0].tag.name if isinstance(path[0], SideOutputNode) else None
            for step in path[1:] if side is not None else path:
                if not isinstance(step, KeyByNode):
                    raise PipelineError(
                        f"'{step.name}' ({step.kind}) sits between '{upstream.name}' and '{node.name}', keyed steps after "
                        f"the fan-out after '{source.name}'; there only key_by is supported yet (a side output and then "
                        f"key_by): move it into '{upstream.name}' or '{node.name}'", step.name,
                    )
            level.append(node)
            reads.append((j, side))
        if not level:  # not reached: every keyed step after source reads a lane of some level
            raise PipelineError(f"'{rest[0].name}' cannot be placed after the fan-out after '{source.name}'", rest[0].name)
        levels.append(Level(tuple(level), tuple(reads)))
        rest = [n for n in rest if not any(n is lane for lane in level)]
        previous = tuple(level)
    return tuple(levels)


def _stem(graph: Graph, source: Node, lanes: tuple[Node, ...], readers: dict[int, list[Node]]) -> Node:
    """Where the rows of ``source`` fan out: the last step after it (or itself) that every
    lane and every sink reading ``source`` pass through — the steps up to it (``map``,
    filters...) run once, on the stream, before the rows are copied per lane."""
    readers_of_source = [*lanes, *(s for s in graph.sinks if any(a is source for a in ancestors(s)))]

    def before_all(node: Node) -> bool:
        return all(node is n or any(a is node for a in ancestors(n)) for n in readers_of_source)

    stem = source
    while True:
        nexts = readers.get(id(stem), [])
        if len(nexts) != 1 or not isinstance(nexts[0], _CARRIES_TIME) or not before_all(nexts[0]) \
                or getattr(nexts[0], "dead_letter", None) is not None or any(nexts[0] is lane for lane in lanes):
            return stem
        stem = nexts[0]


def _split(graph: Graph) -> tuple[Node | None, list[SideOutputNode], list[SinkNode]]:
    """Where a job with several sinks splits, and which outputs leave the query beside it.

    The split (``fork``) is the last step every sink reads from whose followers all
    read from it or from each other. Ember runs the graph up to it as one streaming
    query and the steps after it on every micro-batch, so those must be stateless
    (None for a job with one sink).

    When that would put a stateful step after the split only because the job also
    reads the dead letters of a ``parse_json`` step (decoded JSON feeding a window,
    say), those dead letters *detour*: the decoding step spools them beside the
    query per micro-batch, and their (stateless) branch is written from the spool
    after the micro-batch's other sinks. Returns the split, the detoured side outputs and
    the sinks written from the query's own rows."""
    try:
        return _fork(graph, graph.sinks), [], graph.sinks
    except PipelineError as problem:
        detours = [
            n for n in graph.nodes
            if isinstance(n, SideOutputNode) and isinstance(n.inputs[0], ParseJsonNode)
            and n.tag == n.inputs[0].dead_letter
        ]
        detoured = {id(s) for d in detours for s in graph.sinks_after(d)}
        rest = [s for s in graph.sinks if id(s) not in detoured]
        if not detours or not rest:
            raise
        for d in detours:  # a detour is a stateless branch of its own, from the side output to its sinks
            branch = [n for n in graph.nodes if id(d) in {id(a) for a in ancestors(n)} and not isinstance(n, SinkNode)]
            if _branch_problem(branch, {id(a) for a in ancestors(d)} | {id(d)}, d, d.name) is not None:
                raise problem from None
        return _fork(graph, rest), detours, rest


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


def upstream_steps(node: Node, graph: Graph) -> list[Node]:
    """The keyed-runtime steps whose outputs ``node`` reads with no other such step in between,
    in graph order: none, one, or — for a two-input step — one per input."""
    upstream = [a for a in ancestors(node) if _keyed_state(a, graph)]
    direct = [a for a in upstream if not any(b is a for u in upstream for b in ancestors(u))]
    return [n for n in graph.nodes if any(n is a for a in direct)]


def _check_chains(graph: Graph) -> None:
    """A keyed-runtime step reads at most one other (a chain; joins of two stateful
    streams are not built yet), and the steps between two of them keep the rows'
    event time: key_by, filters, and Python map / flat_map, which pass each output
    row on with its input record's hidden event-time columns (not yet map_batches)."""
    for node in runtime_steps(graph):
        direct = upstream_steps(node, graph)
        if len(direct) > 1 and not _one_per_input(node, direct):
            raise PipelineError(
                f"'{node.name}' reads the outputs of several stateful steps ({', '.join(a.name for a in direct)}); "
                "a step reading two stateful streams is not supported yet (a two-input step may read one: "
                "run the other's part as its own job)",
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
                if not isinstance(step, _CARRIES_TIME):
                    raise PipelineError(
                        f"'{step.name}' ({step.kind}) sits between the stateful steps '{upstream.name}' and "
                        f"'{node.name}'; between two stateful steps only key_by, filter, map, flat_map and a side output are "
                        "supported yet (a step there must pass each record's event time on): move it before "
                        f"'{upstream.name}' or into its function",
                        step.name,
                    )


def _one_per_input(node: Node, direct: list[Node]) -> bool:
    """Whether ``node`` is a two-input step reading one of the stateful steps ``direct`` on
    each input (each input's rows then carry their own step's event time)."""
    if not isinstance(node, CoProcessNode | IntervalJoinNode) or len(direct) != 2 or len(node.inputs) != 2:
        return False
    per_input = [[a for a in direct if a is i or any(a is b for b in ancestors(i))] for i in node.inputs]
    return all(len(found) == 1 for found in per_input) and per_input[0][0] is not per_input[1][0]


# Steps that must be a job's only stateful step on their path (before / after them), yet:
# Spark plans a SQL step on records with their own event time, which Ember's steps carry in
# hidden columns. (A co-process step, and an interval join beside other stateful steps, run
# on Ember's keyed runtime and chain like any keyed step: _check_chains.)
_ALONE: tuple[tuple[type[Node], str, bool, str], ...] = (
    (SqlNode, "the SQL step", True,
     "a SQL step with other stateful steps in one job is not supported yet: do that part in the query, or run "
     "it as its own job"),
)


def _check_alone(graph: Graph) -> None:
    """The steps of ``_ALONE`` with another stateful step before them (or after them) are refused."""
    for node in graph.nodes:
        for kind, what, nothing_after, advice in _ALONE:
            if not isinstance(node, kind):
                continue
            before = [a for a in ancestors(node) if isinstance(a, STATEFUL)]
            after = [n for n in graph.nodes if isinstance(n, STATEFUL) and any(a is node for a in ancestors(n))]
            for other, where in ((before, "before"), (after if nothing_after else [], "after")):
                if other:
                    raise PipelineError(
                        f"the stateful step '{other[0].name}' comes {where} {what} '{node.name}'; {advice}", node.name
                    )
            break
