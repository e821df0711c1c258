"""The matcher: a pattern compiled to an NFA over one key's events, run event by event.

A *partial match* holds the events taken so far and what it waits for:

- ``LOOP``: more events of its current (looping) stage;
- ``NEXT``: the first event of a later stage ``target`` (optional stages in between skipped),
  with the negative stages it crosses;
- ``TRAIL``: the end of the window, with no event of a trailing ``not_followed_by`` stage.

Taking an event into a stage spawns one partial per way on (loop, each reachable next stage,
or the end: a match). A waiting partial survives an event it does not take only as its
contiguity allows: never for strict, when the event does not match for relaxed, always for
"any". The semantics, with examples, are in docs/cep.md; ``tests/cep_model.py`` holds an
independent reference (matches enumerated from the definitions) that tests compare with.

Events are given in order (event time: by timestamp, then arrival) with a sequence number;
``advance(t)`` tells the matcher that no event before ``t`` will come (it times out partial
matches and completes trailing negative stages).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Iterable

from ember.cep.pattern import Contiguity, Pattern, positional_arity

__all__ = ["Matcher", "MatchContext", "compile_pattern", "relevance", "sql_relevance", "Plan", "LOOP", "NEXT", "TRAIL"]

LOOP, NEXT, TRAIL = 0, 1, 2
END = -1


class MatchContext:
    """What an iterative condition sees: ``ctx[name]`` the events a partial match took for
    stage ``name`` so far (a list, empty if none)."""

    __slots__ = ("_events", "_names")

    def __init__(self, events: tuple, names: list[str]) -> None:
        self._events, self._names = events, names

    def __getitem__(self, name: str) -> list[dict[str, Any]]:
        if name not in self._names:
            raise KeyError(f"no stage named {name!r} (stages: {', '.join(self._names)})")
        index = self._names.index(name)
        return [e[3] for e in self._events if e[0] == index]

    def get(self, name: str, default: Any = None) -> Any:
        found = self[name] if name in self._names else []
        return found if found else default


@dataclass(frozen=True)
class _Compiled:
    """One stage, ready to evaluate."""

    index: int
    name: str
    test: Callable[[dict[str, Any], tuple, list[str]], bool]
    min: int
    max: int
    inner: str
    contiguity: str
    until: Callable[[dict[str, Any], tuple, list[str]], bool] | None
    negative: bool
    simple: Callable[[dict[str, Any]], Any] | None = None  # the one condition, when it takes the event only (fast path)
    iterative: bool = False  # a condition (or until) reads the partial match (ctx)


def _predicate(cond: Any, sql_columns: dict[str, str]) -> Callable[[dict[str, Any], tuple, list[str]], bool]:
    if isinstance(cond, str):  # a SQL condition: evaluated by Spark before the step, read from its column
        column = sql_columns[cond]
        return lambda e, events, names: bool(e.get(column))
    if positional_arity(cond) == 2:
        return lambda e, events, names: bool(cond(e, MatchContext(events, names)))
    return lambda e, events, names: bool(cond(e))


def _simple(alternatives: tuple[tuple[Any, ...], ...], sql_columns: dict[str, str]) -> Callable[[dict[str, Any]], Any] | None:
    """The stage's condition as a callable of the event alone, when it is one: a Python
    callable of the event, or a SQL condition (a read of its column)."""
    if len(alternatives) != 1 or len(alternatives[0]) != 1:
        return None
    cond = alternatives[0][0]
    if isinstance(cond, str):
        return itemgetter(sql_columns[cond])
    return cond if positional_arity(cond) == 1 else None


def _iterative(cond: Any) -> bool:
    return not isinstance(cond, str) and positional_arity(cond) == 2


def _test(alternatives: tuple[tuple[Any, ...], ...], sql_columns: dict[str, str]) -> Callable[[dict[str, Any], tuple, list[str]], bool]:
    compiled = [[_predicate(c, sql_columns) for c in conj] for conj in alternatives]
    if compiled == [[]]:
        return lambda e, events, names: True
    if len(compiled) == 1 and len(compiled[0]) == 1:
        return compiled[0][0]
    return lambda e, events, names: any(all(p(e, events, names) for p in conj) for conj in compiled)


@dataclass(frozen=True)
class Plan:
    """A validated pattern compiled: its stages and, per positive stage, where it may go on."""

    stages: tuple[_Compiled, ...]
    names: list[str]
    entries: tuple[tuple[int, tuple[int, ...]], ...]  # stages a match may begin with
    successors: dict[int, tuple[tuple[int, tuple[int, ...]], ...]]  # stage -> ((target or END, negatives crossed), ...)
    guards: dict[tuple[int, int], tuple[int, ...]]  # (stage left, target) -> greedy loops left or passed by on the way
    window_ms: int | None
    skip: str
    skip_stage: int | None


def compile_pattern(pattern: Pattern, sql_columns: dict[str, str] | None = None) -> Plan:
    pattern.validate()
    sql_columns = sql_columns or {}
    stages = tuple(
        _Compiled(i, s.name, _test(s.conditions, sql_columns), s.min, s.max, s.inner, s.contiguity,
                  _test(((s.until,),), sql_columns) if s.until is not None else None, s.negative, _simple(s.conditions, sql_columns),
                  any(_iterative(c) for c in (*(c for conj in s.conditions for c in conj), s.until) if c is not None))
        for i, s in enumerate(pattern.stages)
    )

    greedy = {i for i, s in enumerate(pattern.stages) if s.greedy}
    guards: dict[tuple[int, int], tuple[int, ...]] = {}

    def ways_on(after: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
        out, negatives = [], []
        passed = [after] if after in greedy else []
        for stage in stages[after + 1:]:
            if stage.negative:
                negatives.append(stage.index)
                continue
            out.append((stage.index, tuple(negatives)))
            if passed:
                guards[(after, stage.index)] = tuple(passed)
            if stage.min > 0:
                return tuple(out)
            if stage.index in greedy:
                passed.append(stage.index)  # an optional greedy loop passed by
        out.append((END, tuple(negatives)))
        return tuple(out)

    entries = tuple((t, n) for t, n in ways_on(-1) if t != END)
    successors = {s.index: ways_on(s.index) for s in stages if not s.negative}
    skip_stage = pattern.names.index(pattern.skip.stage) if pattern.skip.stage else None
    return Plan(stages, pattern.names, entries, successors, guards, pattern.window_ms, pattern.skip.kind, skip_stage)


def relevance(plan: Plan) -> Callable[[dict[str, Any]], bool] | None:
    """Whether an event can matter to the matcher — start a match, be taken, stop a loop, or
    cut a partial match (a negative stage's, or a greedy loop's guard) — when that depends on
    the event alone: then an event for which this is False leaves every partial match as it
    is (relaxed and non-deterministic contiguity pass over it) and can be dropped before it
    is queued. None when any event may matter: strict contiguity (``next``, ``consecutive``,
    ``not_next``: the very next event counts) or a condition reading the partial match.
    An event a condition raises on counts as relevant: the matcher meets the same condition
    and reports it (the job fails, or the event becomes a dead letter there)."""
    stages = plan.stages
    if any(s.contiguity in (Contiguity.STRICT, Contiguity.NOT_NEXT) or s.inner == Contiguity.STRICT or s.iterative
           for s in stages):
        return None
    names = plan.names

    def alone(test: Callable[[dict[str, Any], tuple, list[str]], bool]) -> Callable[[dict[str, Any]], Any]:
        return lambda e: test(e, (), names)

    tests = [s.simple or alone(s.test) for s in stages] + [alone(s.until) for s in stages if s.until is not None]

    first, *rest = tests
    second = rest[0] if len(rest) == 1 else None  # two tests (a pattern's usual): no generator per event

    def relevant(e: dict[str, Any]) -> bool:
        try:
            if second is not None:
                return bool(first(e) or second(e))
            return any(test(e) for test in tests)
        except Exception:  # noqa: BLE001 - reported where the matcher runs the condition
            return True

    return relevant


def sql_relevance(pattern: Pattern, sql_columns: dict[str, str]) -> tuple[str, ...] | None:
    """The columns of a pattern's SQL conditions when every condition of every stage (and
    every ``until``) is one: an event none of them holds true for meets no condition, so
    where :func:`relevance` applies it is irrelevant — tested on the columns, without a dict
    per event. None when a condition is a Python callable or a stage has none (every event
    meets it)."""
    conditions: list[Any] = []
    for s in pattern.stages:
        if any(not conj for conj in s.conditions):
            return None
        conditions += [c for conj in s.conditions for c in conj]
        if s.until is not None:
            conditions.append(s.until)
    if not conditions or not all(isinstance(c, str) for c in conditions):
        return None
    return tuple(dict.fromkeys(sql_columns[c] for c in conditions))


# A partial match: (mode, stage, count, events, target, negatives, fresh)
#   events: a tuple of (stage index, seq, timestamp, event) in order; the first is the start
#   mode LOOP: waits for more events of ``stage`` (``count`` taken so far)
#   mode NEXT: waits for ``target``'s first event; ``negatives``: negative stages crossed;
#              ``fresh``: no event has passed since the last one taken (for not_next)
#   mode TRAIL: waits for the window's end; ``negatives``: the trailing not_followed_by
Partial = tuple


class Matcher:
    """Runs a :class:`Plan` for one key at a time; the caller keeps each key's partial
    matches (a list of plain tuples, picklable) and hands them in."""

    def __init__(self, plan: Plan, fast: bool = True) -> None:
        self.plan = plan
        self.stages = plan.stages
        self.names = plan.names
        # A plain sequence (_sequence_of) takes the fast path: the same partial matches, fewer steps.
        self.sequence = _sequence_of(plan) if fast else None
        if self.sequence is not None:
            self.event = self._sequence_event  # type: ignore[method-assign]
            self.as_dict = self._sequence_dict  # type: ignore[method-assign]

    # -- time ---------------------------------------------------------------------------
    def advance(self, partials: list[Partial], now: int) -> tuple[list[Partial], list[tuple], list[tuple]]:
        """No event before ``now`` will come: (partials left, matches completed, timed out)."""
        window = self.plan.window_ms
        if window is None or not partials:
            return partials, [], []
        kept, done, expired = [], [], []
        for p in partials:
            if now - p[3][0][2] >= window:
                if p[0] == TRAIL:
                    done.append(p[3])
                else:
                    expired.append(p[3])
            else:
                kept.append(p)
        if done:
            kept, done = self._skip(kept, done)
        completed = {tuple(x[1] for x in m) for m in done}
        return kept, done, [m for m in _unique(expired) if tuple(x[1] for x in m) not in completed]

    # -- one event ----------------------------------------------------------------------
    def event(self, partials: list[Partial], seq: int, ts: int, e: dict[str, Any]) -> tuple[list[Partial], list[tuple], list[tuple]]:
        """Event ``e`` (sequence number ``seq``, time ``ts``): (partials, matches, timed out)."""
        window = self.plan.window_ms
        done: list[tuple] = []
        expired: list[tuple] = []
        if window is not None:
            for p in partials:
                if ts - p[3][0][2] >= window:
                    partials, done, expired = self.advance(partials, ts)
                    break
        stages, names, guards = self.stages, self.names, self.plan.guards
        out: list[Partial] = []
        matches: list[tuple] = []
        for p in partials:
            mode, s, count, events, target, negatives, fresh = p
            if mode == LOOP:
                stage = stages[s]
                if stage.until is not None and stage.until(e, events, names):
                    continue  # the loop stops here; its NEXT partials go on
                took = stage.simple(e) if stage.simple is not None else stage.test(e, events, names)
                if took:
                    self._take(events, s, count + 1, (s, seq, ts, e), out, matches)
                if stage.inner == Contiguity.ANY or (stage.inner == Contiguity.RELAXED and not took):
                    out.append(p)
            elif mode == NEXT:
                guard = guards.get((s, target)) if guards else None
                if guard and any(stages[g].test(e, events, names) for g in guard if g != s or count < stages[s].max):
                    continue  # a greedy loop left (not full) or passed by would take this event: only its longer run goes on
                between = False
                if negatives:
                    if fresh and any(stages[n].contiguity == Contiguity.NOT_NEXT and stages[n].test(e, events, names)
                                     for n in negatives):
                        continue  # the very next event matches a not_next stage: no match through here
                    between = any(stages[n].contiguity == Contiguity.NOT_FOLLOWED_BY and stages[n].test(e, events, names)
                                  for n in negatives)
                stage = stages[target]
                matched = stage.simple(e) if stage.simple is not None else stage.test(e, events, names)
                if matched and (stage.until is None or not stage.until(e, events, names)):
                    self._take(events, target, 1, (target, seq, ts, e), out, matches)
                if between:
                    continue  # a not_followed_by event: no later event of ``target`` may follow it here
                if stage.contiguity == Contiguity.ANY or (stage.contiguity == Contiguity.RELAXED and not matched):
                    out.append((mode, s, count, events, target, negatives, False) if fresh else p)
            else:  # TRAIL
                if not any(stages[n].test(e, events, names) for n in negatives):
                    out.append(p)
        for target, _negatives in self.plan.entries:  # a match may begin with this event (no negative comes first)
            first = stages[target]
            if (first.simple(e) if first.simple is not None else first.test(e, (), names)) and (first.until is None or not first.until(e, (), names)):
                self._take((), target, 1, (target, seq, ts, e), out, matches)
        if matches:
            out, matches = self._skip(out, matches)
        return out, done + matches, expired

    def _sequence_event(self, partials: list[Partial], seq: int, ts: int, e: dict[str, Any]) -> tuple[list[Partial], list[tuple], list[tuple]]:
        """:meth:`event` for a plain sequence (:func:`_sequence_of`): every partial waits for the
        first event of its next stage, so an event is taken or passed over — the same partials,
        in the same order, as the general loop builds."""
        tests, survives = self.sequence  # type: ignore[misc]
        if not partials and len(tests) > 1:  # (a key's usual state: nothing under way)
            return ([(NEXT, 0, 1, ((0, seq, ts, e),), 1, (), True)] if tests[0](e) else partials), [], []
        done: list[tuple] = []
        expired: list[tuple] = []
        window = self.plan.window_ms
        if window is not None:
            for p in partials:
                if ts - p[3][0][2] >= window:
                    partials, done, expired = self.advance(partials, ts)
                    break
        last = len(tests) - 1
        out: list[Partial] = []
        matches: list[tuple] = []
        for p in partials:
            target = p[4]
            took = tests[target](e)
            if took:
                events = (*p[3], (target, seq, ts, e))
                if target == last:
                    matches.append(events)
                else:
                    out.append((NEXT, target, 1, events, target + 1, (), True))
            keep = survives[target]
            if keep is True or (keep is None and not took):
                out.append((NEXT, p[1], p[2], p[3], target, (), False) if p[6] else p)
        if tests[0](e):
            events = ((0, seq, ts, e),)
            if last == 0:
                matches.append(events)
            else:
                out.append((NEXT, 0, 1, events, 1, (), True))
        if matches:
            out, matches = self._skip(out, matches)
            return out, done + matches, expired
        return out, done, expired

    def _take(self, events: tuple, s: int, count: int, item: tuple, out: list[Partial], matches: list[tuple]) -> None:
        """``item`` taken into stage ``s`` (its ``count``-th event): every way on from here."""
        events = (*events, item)
        stage = self.stages[s]
        if count < stage.max:
            out.append((LOOP, s, count, events, None, (), True))
        if count >= stage.min:
            for target, negatives in self.plan.successors[s]:
                if target != END:
                    out.append((NEXT, s, count, events, target, negatives, True))
                elif negatives:
                    out.append((TRAIL, s, count, events, None, negatives, True))
                else:
                    matches.append(events)

    # -- after a match ------------------------------------------------------------------
    def _skip(self, partials: list[Partial], matches: list[tuple]) -> tuple[list[Partial], list[tuple]]:
        """Emit ``matches`` (earliest start first) under the skip strategy: each emitted match
        discards the partial matches and the not yet emitted matches its strategy names."""
        kind = self.plan.skip
        if len(matches) == 1:  # the usual case: no order to settle among matches
            if kind == "no_skip":
                return partials, matches
            start, until = self._range(matches[0])
            return [p for p in partials if not start <= p[3][0][1] < until], matches
        matches = sorted(matches, key=lambda m: tuple(x[1] for x in m))
        if kind == "no_skip":
            return partials, matches
        emitted: list[tuple] = []
        for m in matches:
            if any(_in(m[0][1], r) for r in map(self._range, emitted)):
                continue
            emitted.append(m)
        ranges = [self._range(m) for m in emitted]
        kept = [p for p in partials if not any(_in(p[3][0][1], r) for r in ranges)]
        return kept, emitted

    def _range(self, m: tuple) -> tuple[int, int]:
        """The start sequence numbers (from, until exclusive) an emitted match discards."""
        start = m[0][1]
        kind = self.plan.skip
        if kind == "skip_to_next":
            return start, start + 1
        if kind == "skip_past_last_event":
            return start, m[-1][1] + 1
        named = [x[1] for x in m if x[0] == self.plan.skip_stage]
        if not named:
            return start, start  # the stage took no event (optional): nothing to skip to
        return start, (named[0] if kind == "skip_to_first" else named[-1])

    def as_dict(self, events: Iterable[tuple]) -> dict[str, list[dict[str, Any]]]:
        """A match (or partial match) as {stage name: [events]}, in pattern order."""
        out: dict[str, list[dict[str, Any]]] = {}
        for s, _seq, _ts, e in events:
            out.setdefault(self.names[s], []).append(e)
        return {n: out[n] for n in self.names if n in out}

    def _sequence_dict(self, events: Iterable[tuple]) -> dict[str, list[dict[str, Any]]]:
        """:meth:`as_dict` of a plain sequence: one event per stage, in pattern order already."""
        names = self.names
        return {names[s]: [e] for s, _seq, _ts, e in events}


def _sequence_of(plan: Plan) -> tuple[list[Callable[[dict[str, Any]], Any]], list[bool | None]] | None:
    """The fast path's view of a *plain sequence* — each stage one event (no quantifier, no
    ``until``), none negative, each condition a callable of the event alone: per stage its
    test, and whether a partial waiting for it outlives an event (True: always,
    ``followed_by_any``; None: when the event is not taken, ``followed_by``; False: never,
    ``next``). None for any other pattern."""
    stages = plan.stages
    if plan.guards or any(s.negative or s.min != 1 or s.max != 1 or s.until is not None or s.simple is None
                          for s in stages):
        return None
    keeps: dict[str, bool | None] = {Contiguity.ANY: True, Contiguity.RELAXED: None, Contiguity.STRICT: False}
    if any(s.contiguity not in keeps for s in stages[1:]):
        return None
    tests: list[Callable[[dict[str, Any]], Any]] = [s.simple for s in stages if s.simple is not None]
    survives: list[bool | None] = [None, *(keeps[s.contiguity] for s in stages[1:])]
    return tests, survives


def _in(seq: int, span: tuple[int, int]) -> bool:
    return span[0] <= seq < span[1]


def _unique(matches: list[tuple]) -> list[tuple]:
    seen, out = set(), []
    for m in matches:
        key = tuple(x[1] for x in m)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return sorted(out, key=lambda m: tuple(x[1] for x in m))

