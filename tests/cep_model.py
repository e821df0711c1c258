"""A reference for Ember's CEP, independent of ember.cep.nfa: every match enumerated from
the definitions in docs/cep.md by brute force over a (short) sequence of one key's
events, then emitted in order under the skip strategy.

Definitions (events e_0..e_n-1 in order; a match assigns increasing events to the positive
stages, each stage between its min and max events):

- every assigned event meets its stage's condition, given the events assigned before it
  (iterative conditions), and not the stage's ``until``;
- a stage's first event after the previous assigned event ``a``: strict -> the very next
  event; relaxed -> no event between meets the stage's condition; any -> no constraint;
- a looping stage's next event after its previous one: the same, by its inner contiguity;
  no event between its first and last event meets ``until``;
- negative stages crossed between ``a`` and the next positive stage's first event ``b``:
  not_next -> the event right after ``a`` does not meet it; not_followed_by -> no event
  strictly between ``a`` and ``b`` meets it. A trailing not_followed_by: no event after the
  last one, before the window's end (first timestamp + within), meets it, and the window ended;
- within W: last timestamp - first timestamp < W;
- greedy loops: when a match goes from stage A's last event ``a`` to a later stage's first
  event ``b``, no event after ``a`` up to and including ``b`` meets the condition of A (if A
  is greedy and took fewer than its maximum) or of a greedy optional stage between them that
  took no event.

A match is complete when its last event is processed (a trailing negative: at the first
event at or after the window's end, before it, or at the end of input). Matches complete at
the same point are emitted in order of their events' positions; each emitted match
discards, under the skip strategy, the other matches not yet emitted whose first event lies
in its range.
"""

from __future__ import annotations

import inspect
from typing import Any

INF = 1 << 62


def _holds(cond: Any, e: dict, ctx: dict[str, list[dict]]) -> bool:
    if isinstance(cond, str):
        raise AssertionError("the reference evaluates Python conditions only")
    params = [p for p in inspect.signature(cond).parameters.values() if p.default is p.empty]
    return bool(cond(e, _Ctx(ctx)) if len(params) == 2 else cond(e))


class _Ctx:
    def __init__(self, assigned: dict[str, list[dict]]) -> None:
        self.assigned = assigned

    def __getitem__(self, name: str) -> list[dict]:
        return list(self.assigned.get(name, []))

    def get(self, name: str, default: Any = None) -> Any:
        return list(self.assigned[name]) if self.assigned.get(name) else default


def _meets(stage: Any, e: dict, ctx: dict[str, list[dict]]) -> bool:
    if stage.conditions == ((),):
        return True
    return any(all(_holds(c, e, ctx) for c in conj) for conj in stage.conditions)


def _ctx(assigned: list[tuple[int, int]], events: list[dict], names: list[str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for stage, i in assigned:
        out.setdefault(names[stage], []).append(events[i])
    return out


def enumerate_matches(pattern: Any, events: list[dict], times: list[int]) -> list[tuple[tuple[int, int], ...]]:
    """Every match (tuples of (stage index, event index)), before skipping."""
    stages = pattern.stages
    names = [s.name for s in stages]
    window = pattern.window_ms
    n = len(events)
    found: list[tuple[tuple[int, int], ...]] = []

    def until_between(stage: Any, lo: int, hi: int, assigned: list) -> bool:
        return stage.until is not None and any(_holds(stage.until, events[j], _ctx(assigned, events, names)) for j in range(lo + 1, hi))

    def entry_ok(k: int, last: int | None, b: int, negatives: list[int], guards: list[int], assigned: list) -> bool:
        """Stage k's first event b after the last assigned event ``last`` (None: the match's first)."""
        stage = stages[k]
        ctx = _ctx(assigned, events, names)
        if last is None:
            return True
        if any(_meets(stages[g], events[j], ctx) for g in guards for j in range(last + 1, b + 1)):
            return False
        if stage.contiguity == "strict" and b != last + 1:
            return False
        if stage.contiguity == "relaxed" and any(_meets(stage, events[j], ctx) for j in range(last + 1, b)):
            return False
        for neg in negatives:
            if stages[neg].contiguity == "not_next" and _meets(stages[neg], events[last + 1], ctx):
                return False
            if stages[neg].contiguity == "not_followed_by" and any(_meets(stages[neg], events[j], ctx) for j in range(last + 1, b)):
                return False
        return True

    def fits(stage: Any, i: int, assigned: list) -> bool:
        ctx = _ctx(assigned, events, names)
        return _meets(stage, events[i], ctx) and not (stage.until is not None and _holds(stage.until, events[i], ctx))

    def finish(assigned: list, negatives: list[int]) -> None:
        if not assigned:
            return
        first, last = assigned[0][1], assigned[-1][1]
        if window is not None and times[last] - times[first] >= window:
            return
        if negatives:  # a trailing not_followed_by: nothing meeting it before the window's end
            ctx = _ctx(assigned, events, names)
            for j in range(last + 1, n):
                if times[j] - times[first] >= window:
                    break
                if any(_meets(stages[neg], events[j], ctx) for neg in negatives):
                    return
        found.append(tuple(assigned))

    def stage_from(k: int, last: int | None, assigned: list, negatives: list[int], guards: list[int]) -> None:
        if k == len(stages):
            finish(assigned, negatives)
            return
        stage = stages[k]
        if stage.negative:
            stage_from(k + 1, last, assigned, negatives + [k], guards)
            return
        if stage.min == 0:  # the optional stage takes nothing
            stage_from(k + 1, last, assigned, negatives, guards + [k] if stage.greedy else guards)
        start = 0 if last is None else last + 1
        for b in range(start, n):
            if window is not None and assigned and times[b] - times[assigned[0][1]] >= window:
                break
            if not fits(stage, b, assigned) or not entry_ok(k, last, b, negatives, guards, assigned):
                continue
            loop(k, [*assigned, (k, b)], 1, b)

    def loop(k: int, assigned: list, count: int, prev: int) -> None:
        stage = stages[k]
        if count >= max(stage.min, 1):
            stage_from(k + 1, prev, assigned, [], [k] if stage.greedy and count < stage.max else [])
        if count >= stage.max:
            return
        first = next(i for s, i in assigned if s == k)
        for c in range(prev + 1, n):
            if window is not None and times[c] - times[assigned[0][1]] >= window:
                break
            if not fits(stage, c, assigned):
                continue
            ctx = _ctx(assigned, events, names)
            if stage.inner == "strict" and c != prev + 1:
                continue
            if stage.inner == "relaxed" and any(_meets(stage, events[j], ctx) for j in range(prev + 1, c)):
                continue
            if until_between(stage, first, c, assigned):
                continue
            loop(k, [*assigned, (k, c)], count + 1, c)

    stage_from(0, None, [], [], [])
    return found


def completion(pattern: Any, match: tuple, times: list[int]) -> tuple[int, int]:
    """When a match completes: (event index, 0 before that event's processing / 1 after);
    (len(events), 0) at the end of input."""
    last_stage = pattern.stages[-1]
    first, last = match[0][1], match[-1][1]
    if last_stage.negative:
        for j in range(last + 1, len(times)):
            if times[j] - times[first] >= pattern.window_ms:
                return j, 0
        return len(times), 0
    return last, 1


def skip_range(pattern: Any, match: tuple) -> tuple[int, int]:
    start = match[0][1]
    kind = pattern.skip.kind
    if kind == "no_skip":
        return start, start
    if kind == "skip_to_next":
        return start, start + 1
    if kind == "skip_past_last_event":
        return start, match[-1][1] + 1
    index = [s.name for s in pattern.stages].index(pattern.skip.stage)
    named = [i for s, i in match if s == index]
    if not named:
        return start, start
    return start, named[0] if kind == "skip_to_first" else named[-1]


def emitted(pattern: Any, events: list[dict], times: list[int]) -> list[dict[str, list[dict]]]:
    """The matches a correct implementation emits, in order, as {stage: [events]}."""
    names = [s.name for s in pattern.stages]
    pending = sorted(enumerate_matches(pattern, events, times),
                     key=lambda m: (completion(pattern, m, times), tuple(i for _, i in m)))
    out, discarded = [], set()
    for m in pending:
        key = tuple(i for _, i in m)
        if key in discarded:
            continue
        out.append(m)
        lo, hi = skip_range(pattern, m)
        done_at = completion(pattern, m, times)
        for other in pending:
            okey = tuple(i for _, i in other)
            if okey != key and lo <= other[0][1] < hi and completion(pattern, other, times) >= done_at and other not in out:
                discarded.add(okey)
    return [{name: [events[i] for s, i in m if names[s] == name] for name in names if any(names[s] == name for s, _ in m)}
            for m in out]
