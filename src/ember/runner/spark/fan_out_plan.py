"""Fan-out planning: a keyed-runtime step whose output several keyed steps read.

A Spark query is a tree: a step read by several others would be planned once per reader.
Its readers run instead as *lanes* of one ``transformWithStateInPandas`` operator
(keyed/lanes.py, translators/fanout.py): each row goes to every lane that reads it, grouped
by ``(lane, state bucket)``, and the job splits after that operator. Keyed steps reading the
lanes run as further *levels*, one shared operator each. :func:`fan_out_of` finds the
fan-out and refuses, naming the step, what this runner cannot run there yet.

A stream may also part before any keyed step (:func:`root_fan_out`): a source read by two
keyed steps, or by a window and by a sink of its raw records. The job's first keyed steps
are then the lanes, the stream's rows get their event time once, before they are copied
per lane, and the sinks reading the raw stream take the pass-through lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.errors import PipelineError
from ember.graph.graph import STATEFUL, Graph, ancestors
from ember.graph.nodes import (
    BroadcastProcessNode,
    CoProcessNode,
    FilterNode,
    FlatMapNode,
    IntervalJoinNode,
    KeyByNode,
    LookupJoinNode,
    MapBatchesNode,
    MapNode,
    Node,
    SelectNode,
    SideOutputNode,
    SourceNode,
    UnionNode,
)
from ember.runner.spark.placement import CARRIES_TIME, dead_letters_of, runtime_steps, upstream_steps

__all__ = ["FanOut", "Level", "LANE_STEPS", "SharedDeadLetters", "fan_out_of", "root_fan_out", "lane_inputs"]


@dataclass(frozen=True)
class FanOut:
    """A keyed-runtime step (``source``) whose output several readers take: the keyed
    steps reading it (``lanes``, each through its own stateless steps after the ``stem``,
    :data:`LANE_STEPS`: ``paths``) run as lanes of one Spark operator, and ``through`` says whether
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
    # Whether ``source`` is no keyed step: the stream parts before the job's first keyed steps
    # (root_fan_out), so its rows get their event time at the stem, before they are copied.
    root: bool = False
    # The dead-letter outputs of steps on the lanes' own paths: they leave the query beside it
    # (planner.py, spool.py), each read by sinks through stateless steps only.
    detours: tuple[SideOutputNode, ...] = ()
    # Two-input lanes reading the stem on both inputs: (the lane's index, the steps its second
    # input reads through, as ``paths``; ``paths`` holds its first input's).
    second: tuple[tuple[int, tuple[Node, ...]], ...] = ()
    # One-input lanes reading the stem through a union of several paths: (the lane's index, one
    # more path, as ``paths``, unions left out; ``paths`` holds its first). Each path runs on a
    # copy of the row of its own, and the copies merge into the lane's rows (translators/fanout.py).
    unions: tuple[tuple[int, tuple[Node, ...]], ...] = ()

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
    output's tag; ``steps``: per lane the stateless steps it reads through (:data:`LANE_STEPS`),
    in graph order, ``key_by`` left out)."""

    lanes: tuple[Node, ...]
    reads: tuple[tuple[int, str | None], ...]
    steps: tuple[tuple[Node, ...], ...] = ()
    # Two-input lanes reading two lanes of the level before: (the lane's index, what its second
    # input reads there, as ``reads``, and through which steps, as ``steps``; those hold its first's).
    second: tuple[tuple[int, tuple[int, str | None], tuple[Node, ...]], ...] = ()
    # One-input lanes reading lanes of the level before through a union of several paths: (the
    # lane's index, what one more path reads there, as ``reads``, and through which steps).
    unions: tuple[tuple[int, tuple[int, str | None], tuple[Node, ...]], ...] = ()


# What a lane may read its rows through after the point where the lanes part (each runs on that
# lane's copies only, translators/fanout.py); their dead letters leave the query beside it (a detour).
LANE_STEPS = (FilterNode, MapNode, FlatMapNode, SelectNode, LookupJoinNode, MapBatchesNode)
_ALLOWED = ("only filter, map, flat_map, select, join_lookup and map_batches steps (their dead letters read by sinks, "
            "through stateless steps, only), in any order and number, then key_by, are supported yet")


def _dead_letter_outputs(step: Node, graph: Graph) -> list[SideOutputNode]:
    """The side outputs reading ``step``'s dead letters (a lookup join's: its unmatched
    records; none for a step without)."""
    tag = dead_letters_of(step)
    if tag is None:
        return []
    return [r for r in graph.readers().get(id(step), []) if isinstance(r, SideOutputNode) and r.tag == tag]


def _on_a_lanes_path(step: Node, graph: Graph, ignore: frozenset[int]) -> bool:
    """Whether ``step`` may sit on one lane's own path (between where the lanes part and the
    lane): a ``key_by``, or one of :data:`LANE_STEPS` whose dead letters, if any, detour
    (``ignore``: the dead-letter outputs that may leave the query beside it)."""
    if isinstance(step, KeyByNode):
        return True
    if not isinstance(step, LANE_STEPS):
        return False
    outputs = _dead_letter_outputs(step, graph)
    return dead_letters_of(step) is None or (bool(outputs) and all(id(o) in ignore for o in outputs))


def fan_out_of(graph: Graph, ignore: frozenset[int] = frozenset()) -> FanOut | None:
    """The job's fan-out (:class:`FanOut`), None when no keyed-runtime step's output is
    read by a keyed step and by another reader; raises :class:`PipelineError` for a
    fan-out this runner cannot run yet, naming the step. ``ignore``: the ids of readers
    that do not count (side outputs whose records leave the query beside it: detours)."""
    readers = {k: [r for r in rs if id(r) not in ignore] for k, rs in graph.readers().items()}
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
        if len(lanes) > 1 or through or any(_reads_twice(n, source) or _branches_merged(source, n) for n in lanes):
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
    return _fan_out(graph, source, lanes, through, readers, ignore=ignore)


def root_fan_out(graph: Graph, ignore: frozenset[int] = frozenset()) -> FanOut | None:
    """The fan-out of a stream before any keyed step reads it: the job's first keyed steps
    (``lanes``: no keyed step before them) and the sinks beside them (reading no keyed step:
    the pass-through lane) all read one step, the last they share (``source``: a source, or
    a stateless step after it). None when there is no such step, or only one keyed step
    reads it and nothing else; raises :class:`PipelineError` for what this runner cannot
    run there yet, naming the step. For jobs the planner cannot split otherwise
    (planner.job_fan_out): a job that runs without it plans as it did. ``ignore``: the
    dead-letter outputs that leave the query beside it (as for :func:`fan_out_of`): their
    sinks are not beside the lanes."""
    firsts = tuple(n for n in runtime_steps(graph) if not upstream_steps(n, graph))
    if not firsts:
        return None
    detoured = {id(s) for n in graph.nodes if id(n) in ignore for s in graph.sinks_after(n)}
    beside = [s for s in graph.sinks if not any(a is f for f in firsts for a in ancestors(s)) and id(s) not in detoured]
    ends = [*firsts, *beside]
    shared = [n for n in graph.nodes if all(n is e or any(a is n for a in ancestors(e)) for e in ends)]
    if not shared or (len(firsts) < 2 and not beside):
        return None
    source = shared[-1]
    if any(source is f for f in firsts):
        return None
    readers = {k: [r for r in rs if id(r) not in ignore] for k, rs in graph.readers().items()}
    return _fan_out(graph, source, firsts, bool(beside), readers, root=True, ignore=ignore)


def _fan_out(graph: Graph, source: Node, lanes: tuple[Node, ...], through: bool, readers: dict[int, list[Node]],
             root: bool = False, ignore: frozenset[int] = frozenset()) -> FanOut:
    """The fan-out of ``source``'s rows into ``lanes`` (and the pass-through lane with
    ``through``), checked: what the runner cannot run there is refused, naming the step."""
    stem = _stem(graph, source, lanes, readers)
    for lane in lanes:
        if isinstance(lane, CoProcessNode | IntervalJoinNode):
            _check_two_input_lane(lane, stem, source, root)
    what = f"'{source.name}'" if root else f"the stateful step '{source.name}'"
    instead = "in the path's map or in a function" if root else f"before '{source.name}', or into a function"
    paths = []
    second = []
    unions = []
    for i, lane in enumerate(lanes):
        twice = _reads_twice(lane, stem)
        if twice:
            lane_paths = [_input_path(graph, stem, lane, k) for k in (0, 1)]
        elif lane.inputs and _through_a_union(graph, stem, lane):
            lane_paths = [path for _, path in _union_paths((stem,), lane.inputs[0], lane)]
        else:
            lane_paths = [_between(graph, stem, lane)]
        for path in lane_paths:
            side = bool(path) and isinstance(path[0], SideOutputNode) and path[0].inputs[0] is stem
            for step in path[1:] if side else path:
                if not _on_a_lanes_path(step, graph, ignore):
                    raise PipelineError(
                        f"'{step.name}' ({step.kind}) sits between {what} and '{lane.name}', "
                        f"one of the steps reading '{source.name}'; after the point where they part {_ALLOWED}: "
                        f"let every reader share it (one step before they part), or do it {instead}", step.name,
                    )
        paths.append(lane_paths[0])
        if twice:
            second.append((i, lane_paths[1]))
        else:
            unions += [(i, path) for path in lane_paths[1:]]
    after = _levels(graph, source, lanes, ignore)
    every_lane = [lane for level in (lanes, *(lv.lanes for lv in after)) for lane in level]
    for node in graph.nodes:
        stateful = isinstance(node, (*STATEFUL, SourceNode))
        if stateful and node is not source and not any(node is a for a in ancestors(source)) \
                and not any(node is lane for lane in every_lane) and not _feeds_a_two_input_lane(node, every_lane):
            raise PipelineError(
                f"'{node.name}' ({node.kind}) is on a branch of its own beside the fan-out after '{source.name}'; "
                f"a job that fans out after '{source.name}' reads it in every branch, yet: run that branch as "
                "its own job", node.name,
            )
    for sink in graph.sinks:
        if not any(a is source for a in ancestors(sink)):
            raise PipelineError(
                f"the sink '{sink.name}' does not read the output of '{source.name}', after which the job fans "
                "out; every sink of such a job must (yet): run that branch as its own job", sink.name,
            )
    _check_branches(graph, stem, source)
    copies = (*second, *unions)
    first_level = (lanes + tuple(lanes[i] for i, _ in copies), tuple(paths) + tuple(p for _, p in copies))
    levels = [first_level, *((level.lanes + tuple(level.lanes[i] for i, _, _ in (*level.second, *level.unions)),
                              level.steps + tuple(own for _, _, own in (*level.second, *level.unions))) for level in after)]
    for level_lanes, level_paths in levels:
        _one_reporter(level_lanes, level_paths, graph)
    steps = {id(s): s for _, level_paths in levels for path in level_paths for s in path}
    detours = tuple(o for s in steps.values() for o in _dead_letter_outputs(s, graph))
    return FanOut(source, lanes, tuple(paths), through, stem, after, root, detours, tuple(second), tuple(unions))


class SharedDeadLetters(PipelineError):
    """A step with dead letters on the paths of several lanes (:func:`_one_reporter`): refused
    in its own words, also where the planner retries with detours (planner._with_detours)."""


def _one_reporter(lanes: tuple[Node, ...], paths: tuple[tuple[Node, ...], ...], graph: Graph) -> None:
    """Refuses a step with dead letters on the paths of several lanes of one level: each lane
    runs it on its own copies (translators/fanout.py), so a record it fails on would be a dead
    letter once per lane."""
    for step in {id(s): s for path in paths for s in path}.values():
        if not _dead_letter_outputs(step, graph):
            continue
        on = [lane.name for lane, path in zip(lanes, paths) if any(step is s for s in path)]
        if len(on) > 1:
            several = (f"several keyed steps ({', '.join(repr(n) for n in dict.fromkeys(on))})" if len(set(on)) > 1
                       else f"several paths to '{on[0]}' (a union merges them)")
            raise SharedDeadLetters(
                f"'{step.name}' ({step.kind}) sends dead letters and is on the paths of {several} after the point "
                "where they part; each runs it on its own copy of the rows, so a record it fails on would be a dead "
                "letter once for each: give each its own step, or leave its dead letters out there (yet)", step.name,
            )


def _through_a_union(graph: Graph, stem: Node, lane: Node) -> bool:
    """Whether the one-input step ``lane`` reads ``stem``'s rows through a union."""
    return len(lane.inputs) == 1 and any(isinstance(s, UnionNode) for s in _between(graph, stem, lane))


def _branches_merged(source: Node, lane: Node) -> bool:
    """Whether the one-input step ``lane`` reads ``source``'s rows along several paths, merged by
    a union (each path would plan ``source`` once more in a Spark query, a tree)."""
    return len(lane.inputs) == 1 and len(_union_paths((source,), lane.inputs[0], lane, strict=False)) > 1


def _union_paths(ups: tuple[Node, ...], node: Node, lane: Node, strict: bool = True) -> list[tuple[Node, tuple[Node, ...]]]:
    """Every path of steps from after one of ``ups`` to ``node`` (included), unions left out, with
    the step it starts after: a union of two branches gives two paths (each its own copy of a
    row, as Flink's union forwards each input's records). ``strict``: refuses a union merging
    rows from elsewhere (else such an input gives no path)."""
    if any(node is up for up in ups):
        return [(node, ())]
    if isinstance(node, UnionNode):
        out = []
        for up in node.inputs:
            found = _union_paths(ups, up, lane, strict)
            if not found and strict:
                named = " or ".join(repr(u.name) for u in ups)
                raise PipelineError(
                    f"'{node.name}' (union) merges rows of '{up.name}' that do not pass {named} with rows that do, on "
                    f"the way to '{lane.name}' after the point where the job fans out; there a union merges branches "
                    f"of the rows of {named} only (yet): run that part as its own job", node.name,
                )
            out += found
        return out
    if not node.inputs:
        return []
    return [(start, path + (node,)) for start, path in _union_paths(ups, node.inputs[0], lane, strict)]


def lane_inputs(lane: Node, stem: Node) -> tuple[int, ...]:
    """Which inputs of the two-input step ``lane`` read the fan-out's rows (from ``stem``):
    one — the other comes from elsewhere — or both (:func:`_check_two_input_lane`)."""
    return tuple(i for i, up in enumerate(lane.inputs) if up is stem or any(a is stem for a in ancestors(up)))


def _reads_twice(node: Node, source: Node) -> bool:
    """Whether ``node`` is a two-input step reading ``source``'s rows on both inputs."""
    return isinstance(node, CoProcessNode | IntervalJoinNode) and lane_inputs(node, source) == (0, 1)


def _input_path(graph: Graph, stem: Node, lane: Node, k: int) -> tuple[Node, ...]:
    """The steps after ``stem`` that input ``k`` of the two-input step ``lane`` reads through
    (its ``key_by`` included), in graph order."""
    up = lane.inputs[k]
    return tuple(a for a in graph.nodes if any(b is stem for b in ancestors(a))
                 and (a is up or any(a is b for b in ancestors(up))))


def _check_two_input_lane(lane: Node, stem: Node, source: Node, root: bool, both: bool = True) -> None:
    """A two-input step (co-process, broadcast state, a join on Ember's runtime) as a lane:
    the fan-out's rows on one input — the keyed one of a broadcast step —, on the other a
    stream of its own that passes no stateful step (its rows join the shared operator,
    translators/fanout.py); or (``both``) the fan-out's rows on both inputs, each through
    steps of its own. Refuses anything else, naming the step."""
    reading = list(lane_inputs(lane, stem))
    what = f"'{source.name}'" if root else f"the stateful step '{source.name}'"
    if len(reading) == 2:
        if not both or isinstance(lane, BroadcastProcessNode):
            raise PipelineError(
                f"'{lane.name}' ({lane.kind}) reads {what} on both inputs"
                f"{'' if both else ', after the fan-out'}; {'a broadcast step' if both else 'there a two-input step'} "
                "reads it on one input only (yet): run that part as its own job", lane.name,
            )
        return
    if isinstance(lane, BroadcastProcessNode) and reading[0] != 0:
        raise PipelineError(
            f"'{lane.name}' ({lane.kind}) reads {what} as its broadcast stream, and other steps read it too; "
            "in a fan-out a broadcast step reads it on its keyed input only (yet): run that part as its own job",
            lane.name,
        )
    other = lane.inputs[1 - reading[0]]
    before = [a for a in (other, *ancestors(other)) if any(a is b for b in ancestors(stem))]
    if before:
        raise PipelineError(
            f"'{lane.name}' ({lane.kind}) reads {what} on one input, with other steps, and '{before[0].name}' on "
            f"the other, a step before the point where the job fans out after '{source.name}' (its rows would be "
            "read twice): give it a stream of its own, or run that part as its own job", lane.name,
        )
    held = [a for a in (other, *ancestors(other)) if isinstance(a, STATEFUL)]
    if held:
        raise PipelineError(
            f"'{lane.name}' ({lane.kind}) reads {what} on one input, with other steps, and the stateful step "
            f"'{held[0].name}' on the other; a two-input step in a fan-out reads a stream of its own there (yet): "
            "run that part as its own job", lane.name,
        )


def _feeds_a_two_input_lane(node: Node, lanes: list[Node]) -> bool:
    """Whether ``node`` is on the other input of a two-input lane (its own source, say)."""
    return any(isinstance(lane, CoProcessNode | IntervalJoinNode) and any(node is a for a in ancestors(lane))
               for lane in lanes)


def _check_branches(graph: Graph, stem: Node, source: Node) -> None:
    """The job splits after the shared operators: a step after the stem reads no step before
    it but the stem (nor such a step's side output) — those rows do not pass the operator."""
    before = [stem, *ancestors(stem)]
    for node in graph.nodes:
        if isinstance(node, SideOutputNode) or any(node is b for b in before):
            continue  # (a side output: its readers are checked)
        for parent in node.inputs:
            early = parent.inputs[0] if isinstance(parent, SideOutputNode) else parent
            if early is not stem and any(early is b for b in before):
                what = (f"the side output '{parent.tag.name}' of '{early.name}'" if isinstance(parent, SideOutputNode)
                        else f"'{early.name}'")
                raise PipelineError(
                    f"'{node.name}' reads {what}, a step before the point where the job fans out after "
                    f"'{source.name}'; after it every branch starts from '{stem.name}' (or from a step reading it): "
                    "read that output before the fan-out, or run that branch as its own job", node.name,
                )


def _between(graph: Graph, upstream: Node, node: Node) -> tuple[Node, ...]:
    """The steps after ``upstream`` that ``node`` reads through, in graph order."""
    return tuple(a for a in graph.nodes if any(b is upstream for b in ancestors(a)) and any(a is b for b in ancestors(node)))


def _levels(graph: Graph, source: Node, lanes: tuple[Node, ...], ignore: frozenset[int]) -> tuple[Level, ...]:
    """The keyed steps after a fan-out's first lanes, level by level (:class:`Level`)."""
    levels: list[Level] = []
    previous = lanes
    rest = [n for n in runtime_steps(graph) if any(a is source for a in ancestors(n)) and not any(n is lane for lane in lanes)]
    while rest:
        level: list[Node] = []
        reads: list[tuple[int, str | None]] = []
        steps: list[tuple[Node, ...]] = []
        second: list[tuple[int, tuple[int, str | None], tuple[Node, ...]]] = []
        unions: list[tuple[int, tuple[int, str | None], tuple[Node, ...]]] = []
        for node in rest:
            direct = upstream_steps(node, graph)
            if len(direct) == 2 and isinstance(node, CoProcessNode | IntervalJoinNode):
                direct.sort(key=lambda d: lane_inputs(node, d))  # the step on the first input first
            found = [next((j for j, lane in enumerate(previous) if lane is up), None) for up in direct]
            merged = any(_through_a_union(graph, up, node) for up in direct)
            if merged and len(set(j is None for j in found)) > 1:
                raise PipelineError(
                    f"'{node.name}' reads stateful steps ({', '.join(a.name for a in direct)}) of different levels "
                    f"of the fan-out after '{source.name}' through a union; there a union merges lanes of one level "
                    "(yet): run that part as its own job", node.name,
                )
            if len(direct) > 1 and not merged and not _two_lanes(node, direct, found):
                raise PipelineError(
                    f"'{node.name}' reads stateful steps ({', '.join(a.name for a in direct)}) after the fan-out "
                    f"after '{source.name}'; there a two-input step reads one on each input, both keyed steps of "
                    "one level (each reading the level before), yet: run that part as its own job", node.name,
                )
            if found[0] is None:
                continue
            if len(direct) == 1 and isinstance(node, CoProcessNode | IntervalJoinNode):
                _check_two_input_lane(node, direct[0], direct[0], False, both=False)
            if merged:  # one path per branch of the union, each from the lane it starts after
                routes = [(found[[id(d) for d in direct].index(id(up))], path)
                          for up, path in _union_paths(tuple(direct), node.inputs[0], node)]
            else:
                routes = [(j, _input_path(graph, upstream, node, k) if len(direct) > 1 else _between(graph, upstream, node))
                          for k, (upstream, j) in enumerate(zip(direct, found))]
            per_input = []
            for j, path in routes:
                assert j is not None
                upstream = previous[j]
                side = path[0].tag.name if path and isinstance(path[0], SideOutputNode) else None
                own = tuple(s for s in (path[1:] if side is not None else path) if not isinstance(s, KeyByNode))
                for step in own:
                    if not _on_a_lanes_path(step, graph, ignore):
                        raise PipelineError(
                            f"'{step.name}' ({step.kind}) sits between '{upstream.name}' and '{node.name}', keyed steps after "
                            f"the fan-out after '{source.name}'; there {_ALLOWED}: move it into '{upstream.name}' or "
                            f"'{node.name}'", step.name,
                        )
                per_input.append(((j, side), own))
            if merged:
                unions += [(len(level), *extra) for extra in per_input[1:]]
            elif len(per_input) > 1:
                second.append((len(level), *per_input[1]))
            level.append(node)
            reads.append(per_input[0][0])
            steps.append(per_input[0][1])
        if not level:  # not reached: every keyed step after source reads a lane of some level
            raise PipelineError(f"'{rest[0].name}' cannot be placed after the fan-out after '{source.name}'", rest[0].name)
        levels.append(Level(tuple(level), tuple(reads), tuple(steps), tuple(second), tuple(unions)))
        rest = [n for n in rest if not any(n is lane for lane in level)]
        previous = tuple(level)
    return tuple(levels)


def _two_lanes(node: Node, direct: list[Node], found: list[int | None]) -> bool:
    """Whether ``node`` is a two-input step (no broadcast one) reading two keyed steps ``direct``
    one on each input, in that order, both lanes of the level before (``found``: their places
    there; both None: not yet, a later level's)."""
    if not isinstance(node, CoProcessNode | IntervalJoinNode) or isinstance(node, BroadcastProcessNode) \
            or len(direct) != 2 or (found[0] is None) != (found[1] is None):
        return False
    return [lane_inputs(node, d) for d in direct] == [(0,), (1,)]


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
        if len(nexts) != 1 or not isinstance(nexts[0], CARRIES_TIME) or not before_all(nexts[0]) \
                or getattr(nexts[0], "dead_letter", None) is not None or any(nexts[0] is lane for lane in lanes):
            return stem
        stem = nexts[0]


