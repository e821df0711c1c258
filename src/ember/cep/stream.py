"""``CEP.pattern(keyed_stream, pattern)`` -> :class:`PatternStream` -> ``.process(...)`` /
``.select(...)``: the pattern as one keyed step of the job (Flink's ``CEP.pattern``)."""

from __future__ import annotations

from typing import Any, Callable

from ember.api.datastream import DataStream, KeyedStream
from ember.api.dead_letters import optional_dead_letter_tag
from ember.cep.operator import SQL_PREFIX, CepFunction, PatternProcessFunction, SelectFunction
from ember.cep.pattern import Pattern
from ember.errors import PipelineError

__all__ = ["CEP", "PatternStream"]


class CEP:
    """Flink's entry point: ``CEP.pattern(events.key_by("user"), pattern)``."""

    @staticmethod
    def pattern(stream: DataStream, pattern: Pattern) -> "PatternStream":
        """Matches of ``pattern`` per key of a keyed stream; on a plain stream, over the
        whole stream (one key, one task — as Flink runs a non-keyed pattern)."""
        if not isinstance(stream, DataStream):
            raise PipelineError(f"CEP.pattern takes a stream (keyed or not), got {stream!r}", "pattern")
        if not isinstance(stream, KeyedStream):
            stream = stream._as_one_key()
        if not isinstance(pattern, Pattern):
            raise PipelineError(f"CEP.pattern takes a Pattern (Pattern.begin(...)...), got {pattern!r}", "pattern")
        return PatternStream(stream, pattern.validate())


class PatternStream:
    """A pattern over a keyed stream; ``process`` or ``select`` makes it a step."""

    def __init__(self, stream: KeyedStream, pattern: Pattern) -> None:
        self.stream, self.pattern = stream, pattern

    def process(self, fn: PatternProcessFunction, output_schema: Any, *, timed_out: Any = None, late: Any = None,
                dead_letter: Any = None, name: str | None = None) -> DataStream:
        """``fn.process_match(match, ctx)`` per match, yielding records of ``output_schema``;
        with ``timed_out=OutputTag(name, schema)``, ``fn.process_timed_out_match`` per partial
        match cut short by ``within``; with ``late=OutputTag(name, schema)`` (event time), the
        events that came behind the watermark, as they are (read either with
        ``get_side_output(tag)``; without ``late`` they are dropped and counted).
        ``dead_letter=OutputTag(...)``: an event a condition raises on goes to that side
        output (``raw``: the event as JSON, ``error``: why) and leaves every partial match as
        it was, as if it had not arrived; a match ``fn`` raises on goes there too (``raw``:
        the match as JSON). Without it, either fails the job naming the step."""
        step = name or "pattern"
        if not isinstance(fn, PatternProcessFunction):
            raise PipelineError(f"process takes a PatternProcessFunction instance, got {fn!r}", step)
        if timed_out is not None and (getattr(timed_out, "name", None) is None or getattr(timed_out, "schema", None) is None):
            raise PipelineError("timed_out takes an OutputTag with a schema, e.g. OutputTag('partial', 'user string')", step)
        if late is not None and (getattr(late, "name", None) is None or getattr(late, "schema", None) is None):
            raise PipelineError("late takes an OutputTag with the stream's schema, e.g. OutputTag('late', 'ts bigint, user string')",
                                step)
        if timed_out is not None and self.pattern.window_ms is None:
            raise PipelineError("timed_out needs a pattern with within(...): without a window nothing times out", step)
        dead = optional_dead_letter_tag(dead_letter, "pattern dead_letter", name)
        keyed, sql_columns = self._with_sql_conditions()
        function = CepFunction(self.pattern, fn, step, timed_out, sql_columns, late, dead)
        return keyed.process(function, output_schema, dead_letter=dead, name=name)

    def select(self, fn: Callable[[dict[str, list[dict[str, Any]]]], Any], output_schema: Any, *,
               late: Any = None, dead_letter: Any = None, name: str | None = None) -> DataStream:
        """One record per match: ``fn(match)`` (a dict or tuple of ``output_schema``);
        ``late`` and ``dead_letter`` as for :meth:`process`."""
        if not callable(fn):
            raise PipelineError(f"select takes a function of the match, got {fn!r}", name or "pattern")
        return self.process(SelectFunction(fn), output_schema, late=late, dead_letter=dead_letter, name=name)

    def _with_sql_conditions(self) -> tuple[KeyedStream, dict[str, str]]:
        """SQL conditions become columns Spark computes before the step (vectorised); the
        matcher reads them. The stream is re-keyed on the same keys after that projection."""
        expressions = []
        for stage in self.pattern.stages:
            for conj in stage.conditions:
                expressions += [c for c in conj if isinstance(c, str)]
            if isinstance(stage.until, str):
                expressions.append(stage.until)
        if not expressions:
            return self.stream, {}
        columns = {expr: f"{SQL_PREFIX}{i}" for i, expr in enumerate(dict.fromkeys(expressions))}
        upstream = DataStream(self.stream._env, self.stream._node.inputs[0])
        projected = upstream.select("*", *[f"({expr}) AS {col}" for expr, col in columns.items()])
        return (projected.key_by(*self.stream.keys) if self.stream.keys else projected._as_one_key()), columns

