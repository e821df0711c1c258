"""Pattern declarations (Flink's CEP pattern API, Pythonic): a sequence of named stages,
each with conditions, a quantifier and its contiguity to the stage before.

    Pattern.begin("login").where(lambda e: e["type"] == "login")
        .followed_by("fail").where(lambda e: e["type"] == "fail").times(3).consecutive()
        .not_followed_by("ok").where(lambda e: e["type"] == "ok")
        .within(timedelta(minutes=1))

Every builder method returns a new :class:`Pattern` (declarations are immutable); the
quantifier and condition methods apply to the last stage. The whole pattern is checked by
:meth:`Pattern.validate` (``CEP.pattern`` calls it), with messages naming the stage.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Callable

from ember.errors import PipelineError
from ember.time.durations import to_ms

__all__ = ["Pattern", "Stage", "Contiguity", "SkipStrategy", "INFINITE"]

INFINITE = 1 << 62  # an unbounded quantifier's maximum
_GREEDY_NEEDS_A_LOOP = "greedy() applies to a looping stage (times(a, b), one_or_more, times_or_more)"


class Contiguity:
    """How a stage's first event relates to the previous stage's last one (or, inside a
    looping stage, how its events relate to each other)."""

    STRICT = "strict"  # next / consecutive(): the very next event
    RELAXED = "relaxed"  # followed_by / loops by default: the first matching event later
    ANY = "any"  # followed_by_any / allow_combinations(): any matching event later
    NOT_NEXT = "not_next"  # a negative stage: the very next event must not match
    NOT_FOLLOWED_BY = "not_followed_by"  # a negative stage: no matching event in between


@dataclass(frozen=True)
class SkipStrategy:
    """What is discarded after a match is emitted (Flink's after-match skip strategies)."""

    kind: str = "no_skip"
    stage: str | None = None

    @staticmethod
    def no_skip() -> "SkipStrategy":
        return SkipStrategy("no_skip")

    @staticmethod
    def skip_to_next() -> "SkipStrategy":
        return SkipStrategy("skip_to_next")

    @staticmethod
    def skip_past_last_event() -> "SkipStrategy":
        return SkipStrategy("skip_past_last_event")

    @staticmethod
    def skip_to_first(stage: str) -> "SkipStrategy":
        return SkipStrategy("skip_to_first", stage)

    @staticmethod
    def skip_to_last(stage: str) -> "SkipStrategy":
        return SkipStrategy("skip_to_last", stage)

    def describe(self) -> str:
        return self.kind + (f"({self.stage!r})" if self.stage else "")


Condition = Callable[..., bool]


@dataclass(frozen=True)
class Stage:
    """One named stage. ``conditions``: a list of alternatives (``or_``), each a tuple of
    predicates that must all hold (``where``). A predicate is a Python callable taking the
    event (a dict) or ``(event, ctx)`` — ``ctx[name]`` the events already matched to stage
    ``name`` — or a Spark SQL expression string, evaluated vectorised per batch."""

    name: str
    contiguity: str = Contiguity.RELAXED
    conditions: tuple[tuple[Any, ...], ...] = ((),)
    min: int = 1
    max: int = 1
    inner: str = Contiguity.RELAXED  # between a looping stage's events
    until: Any = None
    looping: bool = False  # declared with times/one_or_more/times_or_more (a quantifier over 1)
    greedy: bool = False  # the stages after the loop never take nor pass over an event the loop's condition meets

    @property
    def negative(self) -> bool:
        return self.contiguity in (Contiguity.NOT_NEXT, Contiguity.NOT_FOLLOWED_BY)

    @property
    def optional(self) -> bool:
        return self.min == 0

    def describe(self) -> str:
        quant = ""
        if self.min != 1 or self.max != 1:
            top = "inf" if self.max >= INFINITE else str(self.max)
            quant = f"{{{self.min},{top}}}" + ("" if self.inner == Contiguity.RELAXED else f" {self.inner}")
            quant += " greedy" if self.greedy else ""
        return f"{self.contiguity} {self.name}{quant}"


@dataclass(frozen=True)
class Pattern:
    """A pattern sequence (immutable; every method returns a new one)."""

    stages: tuple[Stage, ...] = ()
    window_ms: int | None = None
    skip: SkipStrategy = field(default_factory=SkipStrategy)

    # -- starting and adding stages --------------------------------------------------
    @staticmethod
    def begin(name: str, skip: SkipStrategy | None = None) -> "Pattern":
        """The pattern's first stage, named ``name``; ``skip``: the after-match skip strategy
        (default ``SkipStrategy.no_skip()``: every match is emitted)."""
        if skip is not None and not isinstance(skip, SkipStrategy):
            raise PipelineError(f"skip must be a SkipStrategy (e.g. SkipStrategy.skip_past_last_event()), got {skip!r}", "pattern")
        return Pattern((Stage(_name(name, ())),), None, skip or SkipStrategy())

    def next(self, name: str) -> "Pattern":
        """A stage whose first event is the very next event (strict contiguity)."""
        return self._add(name, Contiguity.STRICT)

    def followed_by(self, name: str) -> "Pattern":
        """A stage whose first event is the first matching event later (relaxed contiguity)."""
        return self._add(name, Contiguity.RELAXED)

    def followed_by_any(self, name: str) -> "Pattern":
        """A stage whose first event is any matching event later (non-deterministic relaxed)."""
        return self._add(name, Contiguity.ANY)

    def not_next(self, name: str) -> "Pattern":
        """A negative stage: the event right after the previous stage must not match."""
        return self._add(name, Contiguity.NOT_NEXT)

    def not_followed_by(self, name: str) -> "Pattern":
        """A negative stage: no matching event between the previous stage and the next one
        (as the last stage: within the pattern's window, which is then required)."""
        return self._add(name, Contiguity.NOT_FOLLOWED_BY)

    def _add(self, name: str, contiguity: str) -> "Pattern":
        return replace(self, stages=(*self.stages, Stage(_name(name, self.stages), contiguity)))

    # -- the last stage's conditions ---------------------------------------------------
    def where(self, condition: Any) -> "Pattern":
        """A condition the stage's events must meet (several ``where``: all of them)."""
        cond = _condition(condition, self._last.name)
        alternatives = self._last.conditions
        return self._with(conditions=(*alternatives[:-1], (*alternatives[-1], cond)))

    def or_(self, condition: Any) -> "Pattern":
        """An alternative: the stage's events meet the conditions so far, or this one."""
        if self._last.conditions == ((),):
            raise PipelineError("or_ needs a where before it", self._last.name)
        return self._with(conditions=(*self._last.conditions, (_condition(condition, self._last.name),)))

    def until(self, condition: Any) -> "Pattern":
        """A looping stage stops taking events at the first event meeting ``condition``."""
        return self._with(until=_condition(condition, self._last.name))

    # -- the last stage's quantifier ----------------------------------------------------
    def times(self, low: int, high: int | None = None) -> "Pattern":
        """Exactly ``low`` events, or from ``low`` to ``high``."""
        high = low if high is None else high
        for value in (low, high):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PipelineError(f"times takes counts >= 1, got {value!r}", self._last.name)
        if high < low:
            raise PipelineError(f"times({low}, {high}): the upper bound is below the lower", self._last.name)
        return self._with(min=low, max=high, looping=high > 1)

    def one_or_more(self) -> "Pattern":
        return self._with(min=1, max=INFINITE, looping=True)

    def times_or_more(self, low: int) -> "Pattern":
        if not isinstance(low, int) or isinstance(low, bool) or low < 1:
            raise PipelineError(f"times_or_more takes a count >= 1, got {low!r}", self._last.name)
        return self._with(min=low, max=INFINITE, looping=True)

    def optional(self) -> "Pattern":
        """The stage may match no event at all."""
        return self._with(min=0)

    def consecutive(self) -> "Pattern":
        """A looping stage's events follow each other with nothing in between (strict)."""
        return self._with(inner=Contiguity.STRICT)

    def allow_combinations(self) -> "Pattern":
        """A looping stage's events may skip matching events (non-deterministic relaxed)."""
        return self._with(inner=Contiguity.ANY)

    def greedy(self) -> "Pattern":
        """A looping stage takes as many events as it can: a partial match that has left the
        loop (or, for an optional loop, passed it by) ends at the first event meeting the
        loop's condition, up to and including the next stage's first event — so the next stage
        never takes an event the loop could take (Flink's greedy quantifier). Needs a looping
        stage and a stage that is not optional after it."""
        if not self._last.looping:
            raise PipelineError(_GREEDY_NEEDS_A_LOOP, self._last.name)
        return self._with(greedy=True)

    # -- the whole pattern -------------------------------------------------------------
    def within(self, window: timedelta | int) -> "Pattern":
        """A match's last event is less than ``window`` after its first (event time, or
        processing time for a stream without event time)."""
        return replace(self, window_ms=to_ms(window, "within"))

    def skip_strategy(self, skip: SkipStrategy) -> "Pattern":
        if not isinstance(skip, SkipStrategy):
            raise PipelineError(f"skip must be a SkipStrategy, got {skip!r}", "pattern")
        return replace(self, skip=skip)

    @property
    def _last(self) -> Stage:
        if not self.stages:
            raise PipelineError("a pattern starts with Pattern.begin(name)", "pattern")
        return self.stages[-1]

    def _with(self, **changes: Any) -> "Pattern":
        return replace(self, stages=(*self.stages[:-1], replace(self._last, **changes)))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def describe(self) -> str:
        text = " ".join(s.describe() for s in self.stages)
        window = f" within {self.window_ms} ms" if self.window_ms is not None else ""
        skip = f" skip {self.skip.describe()}" if self.skip.kind != "no_skip" else ""
        return text.replace("relaxed ", "", 1) + window + skip

    def validate(self) -> "Pattern":
        """Checks what the builder cannot check stage by stage; raises PipelineError naming the stage."""
        stages = self.stages
        if not stages:
            raise PipelineError("a pattern starts with Pattern.begin(name)", "pattern")
        for i, s in enumerate(stages):
            if s.negative:
                if i == 0:
                    raise PipelineError("a pattern cannot begin with a negative stage", s.name)
                if s.min != 1 or s.max != 1:
                    raise PipelineError(f"a negative stage ({s.contiguity}) takes no quantifier", s.name)
                if stages[i - 1].optional or stages[i - 1].negative:
                    raise PipelineError(f"a negative stage cannot follow an optional or negative stage ('{stages[i - 1].name}')", s.name)
                if i == len(stages) - 1 and s.contiguity == Contiguity.NOT_NEXT:
                    raise PipelineError("not_next cannot end a pattern (use not_followed_by with within)", s.name)
                if i == len(stages) - 1 and self.window_ms is None:
                    raise PipelineError("not_followed_by as the last stage needs within(...) on the pattern", s.name)
            if s.negative and s.conditions == ((),):
                raise PipelineError("a negative stage needs a where(...) condition", s.name)
            if s.greedy and s.max <= 1:
                raise PipelineError(_GREEDY_NEEDS_A_LOOP, s.name)
            if s.greedy and not any(t.min > 0 for t in stages[i + 1:] if not t.negative):
                raise PipelineError(
                    "greedy() needs a stage that is not optional after the loop (a match ends after the loop's "
                    "longest run); as the last stage every length would still be a match", s.name)
            if s.until is not None and s.max <= 1:
                raise PipelineError("until applies to a looping stage (one_or_more, times_or_more, times(a, b))", s.name)
            if s.max >= INFINITE and i == len([t for t in stages if not t.negative]) - 1 and self.window_ms is None \
                    and s.until is None and not stages[-1].negative:
                raise PipelineError(
                    "an unbounded last stage (one_or_more / times_or_more) without within(...) or until(...) keeps "
                    "every partial match for ever; bound it", s.name)
        if all(s.optional for s in stages if not s.negative):
            raise PipelineError("every stage is optional: the pattern would match nothing", stages[0].name)
        if self.skip.stage is not None and self.skip.stage not in self.names:
            raise PipelineError(f"the skip strategy names '{self.skip.stage}', which is not a stage ({', '.join(self.names)})", "pattern")
        return self


def _name(name: Any, stages: tuple[Stage, ...]) -> str:
    if not isinstance(name, str) or not name:
        raise PipelineError(f"a stage needs a non-empty name, got {name!r}", "pattern")
    if any(s.name == name for s in stages):
        raise PipelineError(f"two stages are named '{name}'; stage names must be unique", name)
    return name


def _condition(condition: Any, stage: str) -> Any:
    """A predicate as given: a SQL string, or a callable of (event) or (event, ctx)."""
    if isinstance(condition, str):
        if not condition.strip():
            raise PipelineError("a condition string must be a Spark SQL expression", stage)
        return condition
    if not callable(condition):
        raise PipelineError(f"a condition is a callable or a SQL expression string, got {condition!r}", stage)
    arity = positional_arity(condition)
    if arity is not None and arity > 2:
        raise PipelineError(f"a condition takes (event) or (event, ctx), got a function of {arity} arguments", stage)
    return condition


def positional_arity(fn: Any) -> int | None:
    """How many positional arguments without a default ``fn`` takes (None: not inspectable)."""
    try:
        return len([p for p in inspect.signature(fn).parameters.values()
                    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty])
    except (TypeError, ValueError):
        return None
