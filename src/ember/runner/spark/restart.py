"""Restart safety: is a pipeline compatible with the checkpoint it restarts from?

Spark restores a streaming query's state by operator position and its sources by
position, and checks little else: a pipeline whose key changed would read state
stored under other keys; one whose stateful step was removed would hand a state
store to the wrong operator; Python state of another layout would be unpickled
into a function that does not expect it. Ember writes a manifest of the state
the pipeline keeps (``<checkpoint>/ember/pipeline.json``) when a checkpoint is
new and compares the restarted pipeline with it before the query starts.

Compatible: any change to stateless steps (map, filter, select, sinks, ...) and
new state in a process function (a state descriptor added: it starts empty).
Refused, with the operator and the reason: a source added, removed or of another
kind; a stateful operator added, removed or of another kind; its key changed;
its state changed (a process function's state descriptor removed or of another
kind, a window's assigner, trigger, evictor or aggregation). The same check
guards a restore from a savepoint (ember.savepoints).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Any

from ember.errors import RestartError
from ember.graph import nodes as n
from ember.graph.graph import Graph, from_the_sinks
from ember.runner.spark.checkpoint import (
    GROUP_TIMEOUTS,
    GROUP_TIMEOUTS_WHERE_NEEDED,
    CheckpointLayout,
    stored_keyed_operator,
    write_json,
)
from ember.runner.spark.keyed.delta import uses_delta
from ember.runner.spark.keyed.runtime import STATE_BUCKETS, KeyedRuntime
from ember.runner.spark.placement import (
    APWS,
    TWS,
    native_join,
    native_window,
    runtime_steps,
    spark_keyed_operator,
    sql_branches,
    upstream_steps,
)
from ember.runner.spark.planner import beside_parts, job_fan_out

__all__ = ["RestartError", "pipeline_manifest", "check_restart", "compare", "spark_operator_ids", "spark_operator_count",
           "state_buckets", "stored_max_parallelism", "read_manifest", "continued_manifest"]

MANIFEST_VERSION = 1
STATE_BUCKETS_FIELD = "state buckets"


def pipeline_manifest(graph: Any, keyed_operator: str = "auto", state_layout: str = "blob",
                      stored: dict[str, Any] | None = None, state_backend: str = "rocksdb",
                      max_parallelism: int = STATE_BUCKETS) -> dict[str, Any]:
    """Sources and stateful operators of ``graph``, in the order Spark numbers them;
    ``stored``: the manifest of the checkpoint or savepoint the pipeline continues. A step on
    Ember's keyed runtime records its state buckets (``"state buckets"``) unless they are the
    default 128 (a manifest without them, any written before they could change, means 128)."""
    sources = [{"name": s.name, "kind": type(s.source).__name__} for s in graph.sources]
    stateful = [node for node in graph.nodes if _stateful(node)]
    branches = sql_branches(graph)
    parts = beside_parts(graph)
    if branches or parts:  # they run beside the rest, numbered after it: the SQL branches', then the
        # unrelated pipelines' (translators/parts.py), the list from the highest id down
        apart = {id(b) for b in branches} | {id(node) for part in parts for node in part.nodes}
        stateful = [*(node for part in reversed(parts) for node in part.nodes if _stateful(node)), *reversed(branches),
                    *(node for node in stateful if id(node) not in apart)]
    operators = [_operator(node, graph) for node in stateful]
    fan = job_fan_out(graph)
    spark_operator = spark_keyed_operator(graph, keyed_operator, fan is not None, stored_keyed_operator(stored),
                                          state_backend == "rocksdb")
    keyed = runtime_steps(graph)
    for op, node in zip(operators, stateful):
        if any(node is step for step in keyed):  # on Ember's keyed runtime: a Spark Python state operator
            op["spark operator"] = spark_operator
            if max_parallelism != STATE_BUCKETS:
                op[STATE_BUCKETS_FIELD] = max_parallelism
        if uses_delta(node, state_layout, graph):  # keyed/delta.py, always on TWS
            op["spark operator"], op["state layout"] = TWS, "delta"
    if fan is not None:  # the readers of a fan-out share one Spark operator per level, one lane each (keyed/lanes.py)
        for op, node in zip(operators, stateful):
            where = fan.where(node)
            if where is not None:
                op["lane"] = where[1]
                if where[0]:
                    op["level"] = where[0]
    if any(len(upstream_steps(node, graph)) > 1 for node in keyed):
        # a two-input step reading a stateful step on each input: Spark's numbering walks the
        # branches (spark_operator_ids), recorded per operator
        position = {id(node): i for i, node in enumerate(_spark_order(graph, parts))}
        for op, node in zip(operators, stateful):
            op["spark operator id"] = position[id(node)]
    bounded = bool(graph.sources) and all(s.source.bounded for s in graph.sources)
    return {"version": MANIFEST_VERSION, "sources": sources, "bounded": bounded, "operators": operators}


def _spark_order(graph: Any, parts: list[Graph]) -> list[Any]:
    """The graph's stateful steps in the order Spark numbers its stateful operators: depth
    first from the sink, each step's inputs in order (a two-input step's first input is the
    first child of the union it reads; checked on 4.3 by reading each step's state back) —
    the rest of the job first, then the unrelated pipelines beside it (``parts``), as their
    rows join the query's."""
    apart = {id(s) for part in parts for s in part.sinks}
    sinks = [s for s in graph.sinks if id(s) not in apart] + [s for part in parts for s in part.sinks]
    return [node for node in from_the_sinks(sinks) if _stateful(node)]


def spark_operator_ids(operators: list[dict[str, Any]]) -> list[int]:
    """Each manifest operator's Spark operator id (the ``operatorId`` of its state). Spark
    numbers a query's stateful operators from its sink back towards its sources (checked on
    4.3: a chain's last step is operator 0); the lanes of one level of a fan-out (``"lane"``,
    ``"level"``) share one operator, the levels following the steps before the fan-out. A job
    whose two-input step reads a stateful step on each input records each operator's id
    (``"spark operator id"``: Spark walks the branches depth first, pipeline_manifest)."""
    return _numbering(operators)[0]


def spark_operator_count(operators: list[dict[str, Any]]) -> int:
    """How many stateful operators Spark runs for the manifest's ``operators``: one per step
    or fan-out level, a SQL step's as many as its query plans (``"spark operators"``)."""
    return _numbering(operators)[1]


def _numbering(operators: list[dict[str, Any]]) -> tuple[list[int], int]:
    width = {("step", i): int(op.get("spark operators", 1)) for i, op in enumerate(operators)}
    if operators and all("spark operator id" in op for op in operators):
        ids = [int(op["spark operator id"]) for op in operators]
        return ids, len(set(ids))
    owners = [("level", int(op.get("level", 0))) if "lane" in op else ("step", i) for i, op in enumerate(operators)]
    groups = sorted(set(owners), key=lambda g: (g[0] == "level", g[1]))  # Spark's operators from the sources on
    # A SQL step's query may plan none or several (``"spark operators"``, recorded when the job
    # compiled it): its first id is given, the steps before it numbered after all of them.
    order, next_id = {}, 0
    for group in reversed(groups):
        order[group] = next_id
        next_id += width.get(group, 1)
    return [order[owner] for owner in owners], next_id


def state_buckets(op: dict[str, Any]) -> int:
    """The state buckets a keyed step's manifest entry records (its job's ``max_parallelism``)."""
    return int(op.get(STATE_BUCKETS_FIELD, STATE_BUCKETS))


def stored_max_parallelism(manifest: dict[str, Any] | None) -> int | None:
    """The state buckets (``max_parallelism``) the keyed steps of a stored manifest spread their
    keys over; None when it records no step on Ember's keyed runtime."""
    for op in (manifest or {}).get("operators", []):
        if "spark operator" in op:
            return state_buckets(op)
    return None


def read_manifest(checkpoint: str) -> dict[str, Any] | None:
    """The pipeline manifest of a checkpoint with progress (None for a new one, or one whose
    progress predates manifests); raises :class:`RestartError` when it is corrupt."""
    layout = CheckpointLayout(checkpoint)
    if not (layout.has_progress() and os.path.exists(layout.pipeline)):
        return None
    with open(layout.pipeline) as f:
        try:
            stored: dict[str, Any] = json.load(f)
        except ValueError as exc:
            raise RestartError(f"the checkpoint's pipeline manifest {layout.pipeline} is corrupt ({exc})") from exc
    return stored


def continued_manifest(checkpoint: str) -> dict[str, Any] | None:
    """What a checkpoint's pipeline kept, as a manifest: the stored one; for progress written
    before manifests, when a job's one keyed step always ran on applyInPandasWithState with the
    default 128 state buckets, a manifest saying so; None for a new checkpoint."""
    stored = read_manifest(checkpoint)
    if stored is None and CheckpointLayout(checkpoint).has_progress():
        return {"operators": [{"spark operator": APWS}]}
    return stored


def _holder(op: dict[str, Any]) -> str:
    lane = op.get("lane")
    if lane is None:
        return "a Spark operator of its own"
    return f"lane {lane} of a fan-out's shared Spark operator" + (f" (level {op['level']})" if op.get("level") else "")


def check_restart(checkpoint: str, graph: Any, keyed_operator: str = "auto", state_layout: str = "blob",
                  state_backend: str = "rocksdb", max_parallelism: int = STATE_BUCKETS) -> None:
    """Writes the manifest of a new checkpoint; for one with progress, raises
    :class:`RestartError` listing every incompatibility with the stored manifest."""
    layout = CheckpointLayout(checkpoint)
    stored = read_manifest(checkpoint)
    if stored is not None:
        problems = compare(stored, pipeline_manifest(graph, keyed_operator, state_layout, stored, state_backend,
                                                     max_parallelism))
        if problems:
            listed = "\n  - ".join(problems)
            raise RestartError(
                f"this pipeline cannot continue from the checkpoint {checkpoint}:\n  - {listed}\n"
                "Changes to stateless steps are fine; to change state, start from a new checkpoint directory."
            )
        return
    # A checkpoint with progress and no manifest predates manifests: it keeps its keyed step's
    # operator (and its group timeouts).
    current = pipeline_manifest(graph, keyed_operator, state_layout, continued_manifest(checkpoint), state_backend,
                                max_parallelism)
    if not layout.has_progress():
        current[GROUP_TIMEOUTS] = GROUP_TIMEOUTS_WHERE_NEEDED
    write_json(layout.pipeline, current, indent=1)


def compare(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    old_src, new_src = stored.get("sources", []), current["sources"]
    if len(old_src) != len(new_src):
        problems.append(
            f"the checkpoint has {len(old_src)} source(s) ({_names(old_src)}), the pipeline {len(new_src)} ({_names(new_src)})"
        )
    else:
        for old, new in zip(old_src, new_src):
            if old["kind"] != new["kind"]:
                problems.append(f"source '{new['name']}' is a {new['kind']}; the checkpoint's was a {old['kind']} ('{old['name']}')")
    if stored.get("bounded", current["bounded"]) != current["bounded"]:
        ends = {True: "all end (bounded)", False: "do not all end"}
        problems.append(
            f"the checkpoint's sources {ends[stored['bounded']]}, this pipeline's {ends[current['bounded']]}; "
            "an ending pipeline reads one more internal input (its end-of-input marker), so Spark's inputs differ"
        )
    old_ops, new_ops = stored.get("operators", []), current["operators"]
    for i in range(max(len(old_ops), len(new_ops))):
        if i >= len(new_ops):
            problems.append(f"stateful operator '{old_ops[i]['name']}' ({old_ops[i]['kind']}) holds state in the checkpoint but was removed")
            continue
        new = new_ops[i]
        if i >= len(old_ops):
            problems.append(f"stateful operator '{new['name']}' ({new['kind']}) is new: the checkpoint has no state for it")
            continue
        old = old_ops[i]
        where = f"stateful operator '{new['name']}'" + (f" (was '{old['name']}')" if old["name"] != new["name"] else "")
        if old["kind"] != new["kind"]:
            problems.append(f"{where} is a {new['kind']}; the checkpoint holds the state of a {old['kind']}")
            continue
        if old["keys"] != new["keys"]:
            problems.append(f"{where}: key changed from {old['keys']} to {new['keys']}")
        if state_buckets(old) != state_buckets(new) and "spark operator" in new:
            problems.append(
                f"{where}: its keys are spread over {state_buckets(old)} state buckets in the checkpoint, and this "
                f"pipeline has max_parallelism={state_buckets(new)}; a job keeps the max_parallelism of its first run "
                f"(give max_parallelism={state_buckets(old)}, or start from a new checkpoint directory)"
            )
        elif old.get("state layout", "blob") != new.get("state layout", "blob"):
            layouts = {"blob": "one value per state bucket (state_layout='blob')",
                       "delta": "a log of changed rows per state bucket (state_layout='delta')"}
            problems.append(
                f"{where}: its state is kept as {layouts[old.get('state layout', 'blob')]} in the checkpoint, and this "
                f"pipeline keeps it as {layouts[new.get('state layout', 'blob')]}; a checkpoint keeps its layout "
                "(to convert it: stop the job with a savepoint, `ember savepoint create <job> --stop`, and restore "
                "that with the new layout, `ember run ... --state-layout L --from-savepoint PATH`, under a new job name; "
                "docs/savepoints.md)"
            )
        elif (old.get("lane"), old.get("level")) != (new.get("lane"), new.get("level")):
            problems.append(
                f"{where}: its state is held by {_holder(old)} in the checkpoint, and this pipeline runs it on "
                f"{_holder(new)} (docs/design/dataflow.md, \"Fan-out\")"
            )
        elif old.get("spark operator id") != new.get("spark operator id"):
            problems.append(
                f"{where}: Spark numbers its state as operator {old.get('spark operator id', 'by graph order')} in the "
                f"checkpoint and {new.get('spark operator id', 'by graph order')} in this pipeline (the inputs of a "
                "two-input step reading two stateful steps changed places?): keep the pipeline's shape"
            )
        elif "spark operator" in new and old.get("spark operator", APWS) != new["spark operator"]:
            problems.append(
                f"{where}: its state is held by Spark's {old.get('spark operator', APWS)} in the checkpoint, and this "
                f"pipeline runs it on {new['spark operator']} (a job with several keyed steps, or "
                "keyed_operator='transform_with_state', uses the latter; docs/design/dataflow.md)"
            )
        for what in sorted(set(old["state"]) | set(new["state"])):
            before, after = old["state"].get(what), new["state"].get(what)
            if what == "state descriptors" and isinstance(before, dict) and isinstance(after, dict):
                problems += _descriptor_changes(where, before, after)
            elif before != after:
                problems.append(f"{where}: {what} changed from {_show(before)} to {_show(after)}")
    return problems


def _descriptor_changes(where: str, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """A process function's state: new states are fine (they start empty); a state
    that changed kind or was removed is not (its stored values would be misread or dropped)."""
    changed = {n: (before[n], after[n]) for n in before if n in after and before[n] != after[n]}
    removed = sorted(n for n in before if n not in after)
    if not changed and not removed:
        return []
    return [
        f"{where}: state descriptors changed from {_show(before)} to {_show(after)} ("
        + "; ".join(
            [f"'{n}' was a {a}, now a {b}" for n, (a, b) in sorted(changed.items())]
            + [f"'{n}' ({before[n]}) was removed: its stored values would be dropped" for n in removed]
        )
        + ")"
    ]


def _names(items: list[dict[str, Any]]) -> str:
    return ", ".join(i["name"] for i in items) or "none"


def _show(value: Any) -> str:
    return "nothing" if value is None else json.dumps(value, sort_keys=True)


def _stateful(node: n.Node) -> bool:
    return isinstance(node, n.KeyedProcessNode | n.VectorizedProcessNode | n.WindowNode | n.IntervalJoinNode | n.SqlNode)


def _operator(node: n.Node, graph: Graph) -> dict[str, Any]:
    keys = [str(k) for k in getattr(node, "keys", ())]
    if isinstance(node, n.WindowJoinNode):  # both sides' records in keyed state, by window
        return {"name": node.name, "kind": "window join", "keys": [*node.keys, *node.other_keys],
                "state": {"how": node.how, "assigner": _describe(node.assigner)}}
    if isinstance(node, n.BroadcastProcessNode):
        return {"name": node.name, "kind": "broadcast process function", "keys": keys,
                "state": {"state descriptors": _declared_state(node.fn),
                          "broadcast state": sorted(d.name for d in node.descriptors)}}
    if isinstance(node, n.KeyedProcessNode):
        return {"name": node.name, "kind": "process function", "keys": keys,
                "state": {"state descriptors": _declared_state(node.fn)}}
    if isinstance(node, n.VectorizedProcessNode):
        return {"name": node.name, "kind": "vectorised process function", "keys": keys,
                "state": {"state schema": str(getattr(node.fn, "state_schema", None))}}
    if isinstance(node, n.IntervalJoinNode):  # Spark's join state (both sides' rows, by key), or Ember's keyed state
        kind = "interval join" if native_join(node, graph) else "keyed interval join"
        return {"name": node.name, "kind": kind, "keys": [*node.left_keys, *node.right_keys],
                "state": {"how": node.how, "bounds ms": [node.lower_ms, node.upper_ms]}}
    if isinstance(node, n.SqlNode):  # Spark plans its state: the query is what must not change
        return {"name": node.name, "kind": "sql", "keys": [], "state": {"query": " ".join(node.query.split())}}
    assert isinstance(node, n.WindowNode), node  # _stateful() admits these five kinds only
    if native_window(node, graph):  # Spark's own state layout: its operator kind in the manifest
        return {"name": node.name, "kind": "window aggregate", "keys": keys,
                "state": {"assigner": _describe(node.assigner),
                          "aggregation": [[name, repr(agg)] for name, agg in node.aggregates]}}
    state: dict[str, Any] = {
        "assigner": _describe(node.assigner), "trigger": _describe(node.trigger), "evictor": _describe(node.evictor),
    }
    if node.aggregates:
        state["aggregation"] = [[name, repr(agg)] for name, agg in node.aggregates]
    else:
        fn = node.aggregate_fn or node.reduce_fn or node.window_fn
        state["aggregation"] = _qualname(fn)
    return {"name": node.name, "kind": "window", "keys": keys, "state": state}


def _describe(obj: Any, depth: int = 0) -> str | None:
    """A stable description of a declaration: its class and simple settings (no addresses)."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return repr(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return repr(obj)
    fields = getattr(obj, "__dict__", {}) if depth < 3 else {}
    inner = ", ".join(f"{k}={_describe(v, depth + 1)}" for k, v in sorted(fields.items()) if not k.startswith("_"))
    return f"{_qualname(obj)}({inner})"


def _qualname(obj: Any) -> str | None:
    if obj is None:
        return None
    kind = obj if isinstance(obj, type) else type(obj)
    if kind.__name__ == "function":
        return getattr(obj, "__qualname__", repr(obj))
    return kind.__qualname__


class _Recorder:
    """A RuntimeContext that records what ``open()`` declares (run on a copy of the function)."""

    def __init__(self) -> None:
        self.declared: dict[str, str] = {}

    def get_state(self, descriptor: Any) -> Any:
        self.declared[descriptor.name] = type(descriptor).__name__
        return KeyedRuntime(event_time=True).get_state(descriptor)


def _declared_state(fn: Any) -> dict[str, str] | str:
    """State name -> descriptor kind, as ``fn.open`` declares it; a function whose
    open() cannot run on the driver is recorded as such (its state is not compared)."""
    recorder = _Recorder()
    try:
        copy.deepcopy(fn).open(recorder)
    except Exception as exc:  # noqa: BLE001 - open() may need the executor; then state is not compared
        return f"not inspectable ({type(exc).__name__})"
    return dict(sorted(recorder.declared.items()))
