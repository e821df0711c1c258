"""Where each step runs: on Spark's own operators or on Ember's keyed runtime.

- **Windows.** A window runs on Spark's native windowing (``groupBy(window(...))``,
  in the JVM) when Spark's semantics are Flink's for it: built-in aggregates on a
  tumbling or sliding window, or a processing-time session window, with the default
  trigger and nothing else (``WindowNode.plain``), no other stateful step on its path, and
  every sink reading its results (else the job's branches part before it: a fan-out, whose
  steps share one operator of Ember's — fan_out_plan.py).
  An event-time session window runs on Ember's operator: Spark cannot merge a record
  behind the watermark into a session that is still open (Flink does), it drops it.
  Every other window runs on Ember's window operator over keyed state
  (runner/spark/keyed/windows).
- **Interval joins** run on Spark's stream-stream join alone, on the keyed runtime beside
  other stateful steps.
- **Process functions** (and the vectorised variant) always run on the keyed runtime.
- **Which Spark operator holds the keyed runtime** (``spark_keyed_operator``): a job's one
  keyed step runs on ``applyInPandasWithState``, unless it emits one row per input record
  (a rolling aggregation with ``emit="record"``): that operator pads each output batch's
  state rows to the output's length in pandas, a per-row cost ``transformWithStateInPandas``
  does not have (3-4.5x on a keyed running count: docs/design/latency.md). Several keyed
  steps, a fan-out, or a SQL step beside a keyed step run on ``transformWithStateInPandas``
  (Spark chains only that one), as does every step with ``keyed_operator="transform_with_state"``.
  A checkpoint keeps the operator it was written with.

No Spark is needed here: the planner (planner.py) and the fan-out planning (fan_out_plan.py)
build on these answers.
"""

from __future__ import annotations

from typing import TypeGuard

from ember.graph.graph import STATEFUL, Graph, ancestors, components
from ember.graph.nodes import (
    FilterNode,
    FlatMapNode,
    IntervalJoinNode,
    KeyByNode,
    KeyedProcessNode,
    LookupJoinNode,
    MapBatchesNode,
    MapNode,
    Node,
    ParseJsonNode,
    SideOutputNode,
    SqlNode,
    VectorizedProcessNode,
    WindowNode,
)
from ember.rolling import emits_per_record

__all__ = ["APWS", "TWS", "CARRIES_TIME", "DETOURING", "dead_letters_of", "detours", "native_window", "native_join",
           "spark_keyed_operator", "spark_stateful_operators", "runtime_steps", "upstream_steps", "sql_beside_steps", "upstream_sql",
           "upstream_sqls", "sql_branches", "reads_one_of"]

# Steps whose dead letters may detour: stateless, their tasks spool what fails (spool.py, planner.py).
DETOURING = (ParseJsonNode, MapNode, FlatMapNode, FilterNode, MapBatchesNode, LookupJoinNode)


def dead_letters_of(node: Node) -> object:
    """The tag of ``node``'s dead letters (a lookup join's: its unmatched records)."""
    return node.unmatched if isinstance(node, LookupJoinNode) else getattr(node, "dead_letter", None)


def detours(node: Node) -> TypeGuard[SideOutputNode]:
    """Whether ``node`` is the dead-letter output of a stateless step: it may leave the query
    beside it (spool.py, planner.py)."""
    return isinstance(node, SideOutputNode) and isinstance(node.inputs[0], DETOURING) \
        and node.tag == dead_letters_of(node.inputs[0])

# Steps that pass each row on with its event time (hidden columns, translators/eventtime.py);
# a keyed step's side output carries each record's too.
CARRIES_TIME = (KeyByNode, FilterNode, MapNode, FlatMapNode, SideOutputNode)


def native_window(node: WindowNode, graph: Graph) -> bool:
    """Whether the window step runs on Spark's native windowing (else on Ember's window operator).

    Native only when Spark's semantics are Flink's (``node.plain``) and the window is the
    only stateful step on its path: a window reading or feeding another stateful step runs
    on Ember's operator, where event time flows between steps as in Flink."""
    return node.plain and _only_stateful_step_on_its_path(node, graph) and _every_sink_reads(node, graph)


def native_join(node: IntervalJoinNode, graph: Graph) -> bool:
    """Whether the interval join runs on Spark's native stream-stream join: when no other
    stateful step comes before or after it (Spark's join rows have no Ember event time, and
    Ember's steps carry theirs in hidden columns); else on Ember's keyed runtime as a
    co-process step, where event time flows between steps as in Flink — also when its pairs'
    failures go to dead letters (after Spark's join the pairs reach the function in a plain
    Python step, which has no dead-letter output) — and when a sink does not read its pairs
    (a branch parts before it: the job fans out there, the join a lane of it, as a window)."""
    return node.dead_letter is None and _only_stateful_step_on_its_path(node, graph) and _every_sink_reads(node, graph)


def _only_stateful_step_on_its_path(node: Node, graph: Graph) -> bool:
    """Whether no stateful step comes before ``node`` or after it."""
    return not any(isinstance(n, STATEFUL) for n in ancestors(node)) and not any(
        isinstance(n, STATEFUL) and any(a is node for a in ancestors(n)) for n in graph.nodes
    )


def _every_sink_reads(node: Node, graph: Graph) -> bool:
    """Whether every sink reads ``node``'s records — but for sinks of dead letters that detour
    (planner.py) and of SQL branches (:func:`sql_branches`): those leave the query beside it —
    of its own pipeline (graph.components: an unrelated one runs beside it too). A sink that
    does not is on a branch that parts before ``node``, and the job fans out there
    (fan_out_plan.root_fan_out)."""
    branches = sql_branches(graph)
    mine = next(g for g in components(graph) if any(a is node for s in g for a in ancestors(s)))
    for sink in mine:
        if reads_one_of(sink, (node, *branches)):
            continue
        if not any(detours(a) for a in ancestors(sink)):
            return False
    return True


def reads_one_of(node: Node, steps: tuple[Node, ...]) -> bool:
    """Whether ``node`` reads the rows of one of ``steps``, directly or through other steps."""
    return any(a is s for a in ancestors(node) for s in steps)


def sql_branches(graph: Graph) -> tuple[SqlNode, ...]:
    """The SQL steps on branches of their own in a job with several sinks: each reads sources
    through stateless steps only, nothing stateful reads its rows, and some sink does not read
    them. Such a query runs beside the rest of the job, not after its split (where only
    stateless steps can run): its rows join the query's output and leave it at the split
    (planner.py, compiler.py)."""
    if len(graph.sinks) < 2:
        return ()
    out = []
    for node in graph.nodes:
        if not isinstance(node, SqlNode) or any(isinstance(a, STATEFUL) for a in ancestors(node)):
            continue
        after = [n for n in graph.nodes if any(a is node for a in ancestors(n))]
        if any(isinstance(n, STATEFUL) for n in after) or len(graph.sinks_after(node)) == len(graph.sinks):
            continue
        out.append(node)
    return tuple(out)


def spark_stateful_operators(graph: Graph) -> list[Node]:
    """The steps Spark runs as stateful operators: native windows and keyed-state steps."""
    return [n for n in graph.nodes if isinstance(n, STATEFUL)]


APWS, TWS = "applyInPandasWithState", "transformWithStateInPandas"


def spark_keyed_operator(graph: Graph, keyed_operator: str = "auto", fanned_out: bool = False,
                         stored: str | None = None, rocksdb: bool = True) -> str:
    """The Spark operator the graph's keyed-runtime steps run on (module doc). ``fanned_out``:
    the job has a fan-out (planner.job_fan_out), whose lanes share one operator; ``stored``:
    the operator the checkpoint (or savepoint) being continued holds the job's one keyed step
    on, kept where either would do; ``rocksdb``: the state backend is RocksDB, which
    ``transformWithStateInPandas`` needs (else a step it is only faster on stays off it)."""
    steps = runtime_steps(graph)
    if keyed_operator != "auto" or len(steps) > 1 or fanned_out or sql_beside_steps(graph):
        return TWS
    if stored in (APWS, TWS):
        return stored
    if rocksdb and steps and type(steps[0]) is KeyedProcessNode and emits_per_record(steps[0].fn):
        return TWS
    return APWS


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


def upstream_steps(node: Node, graph: Graph) -> list[Node]:
    """The keyed-runtime steps whose outputs ``node`` reads with no other such step (nor a SQL
    step) in between, in graph order: none, one, one per input of a two-input step, or several
    merged by a union."""
    before = list(ancestors(node))
    behind_sql = {id(b) for s in before if isinstance(s, SqlNode) for b in ancestors(s)}
    upstream = [a for a in before if _keyed_state(a, graph) and id(a) not in behind_sql]
    direct = [a for a in upstream if not any(b is a for u in upstream for b in ancestors(u))]
    return [n for n in graph.nodes if any(n is a for a in direct)]




def upstream_sqls(node: Node, graph: Graph) -> list[Node]:
    """The SQL steps whose rows the keyed-runtime step ``node`` reads with no other stateful
    step in between (nor another SQL step), in graph order: one per input of a two-input
    step, or several merged by a union."""
    before = list(ancestors(node))
    behind = {id(b) for s in before if _keyed_state(s, graph) or isinstance(s, SqlNode) for b in ancestors(s)}
    read = {id(a) for a in before if isinstance(a, SqlNode) and id(a) not in behind}
    return [n for n in graph.nodes if id(n) in read]


def upstream_sql(node: Node, graph: Graph) -> Node | None:
    """The first of :func:`upstream_sqls`, if any."""
    return next(iter(upstream_sqls(node, graph)), None)


def sql_beside_steps(graph: Graph) -> bool:
    """Whether a SQL step reads a keyed-runtime step's output, or a keyed-runtime step a SQL
    step's. Those steps then run on Spark's ``transformWithStateInPandas`` (keyed/tws.py), as
    when a job has several keyed steps: Spark passes its watermark on to the operators after
    it (the SQL step's aggregations and joins), which it does not do after
    ``applyInPandasWithState``, and runs it after a SQL step's aggregation."""
    return any(upstream_steps(n, graph) for n in graph.nodes if isinstance(n, SqlNode)) or any(
        upstream_sql(n, graph) is not None for n in runtime_steps(graph))
