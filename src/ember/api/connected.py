"""Two streams connected into one operator (Flink's ``ConnectedStreams``).

``a.connect(b)`` keeps both streams' own types. ``.map(fn1, fn2)`` / ``.flat_map(fn1, fn2)``
apply one function per stream and merge the results (Flink's ``CoMapFunction``:
stateless); ``.key_by(ka, kb).process(fn, schema)`` runs a
:class:`~ember.functions.KeyedCoProcessFunction` with keyed state and timers shared by both
streams (Ember's keyed runtime, ember.coprocess). Like ember.api.joins, this module gets the
stream class handed in, so the API's modules import one way.
"""

from __future__ import annotations

from typing import Any, Callable

from ember.api.dead_letters import optional_dead_letter_tag
from ember.errors import PipelineError
from ember.functions import KeyedCoProcessFunction
from ember.graph import nodes as n

__all__ = ["ConnectedStreams", "ConnectedKeyedStreams"]


def _keys(key: str | tuple[str, ...] | list[str], which: str, step: str) -> tuple[str, ...]:
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise PipelineError(f"connect key_by: the {which} stream's key must be field names, got {key!r}", step)
    return keys


def _part(name: str | None, stream: int) -> str | None:
    """The name of one stream's function step of a named co_map (unnamed: generated, unique)."""
    return f"{name}.{stream}" if name else None


class ConnectedStreams:
    """``first.connect(second)``: waiting for ``map``/``flat_map`` or ``key_by``."""

    def __init__(self, first: Any, second: Any, stream_type: type) -> None:
        if not isinstance(second, stream_type):
            raise PipelineError(f"connect takes a DataStream, got {second!r}", "connect")
        if getattr(second, "_env", None) is not first._env:
            raise PipelineError("cannot connect streams of different environments", "connect")
        self.first: Any = first
        self.second: Any = second
        self.stream_type = stream_type

    def _pair(self, fn1: Any, fn2: Any, what: str, name: str | None) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if fn2 is None and hasattr(fn1, f"{what}1") and hasattr(fn1, f"{what}2"):  # a Co(Flat)MapFunction object
            fn1, fn2 = getattr(fn1, f"{what}1"), getattr(fn1, f"{what}2")
        if not callable(fn1) or not callable(fn2):
            raise PipelineError(
                f"connect {what} takes two functions (one per stream) or an object with {what}1 and {what}2",
                name or f"co_{what}",
            )
        return fn1, fn2

    def map(self, fn1: Any, fn2: Any = None, output_schema: Any = None, *, name: str | None = None) -> Any:
        """``fn1`` on the first stream's records, ``fn2`` on the second's, both results in one
        stream (both must produce ``output_schema``; None: the first stream's schema)."""
        f1, f2 = self._pair(fn1, fn2, "map", name)
        return (self.first.map(f1, output_schema, name=_part(name, 1))
                .union(self.second.map(f2, output_schema, name=_part(name, 2)), name=name))

    def flat_map(self, fn1: Any, fn2: Any = None, output_schema: Any = None, *, name: str | None = None) -> Any:
        """As :meth:`map`, each function returning an iterable of records."""
        f1, f2 = self._pair(fn1, fn2, "flat_map", name)
        return (self.first.flat_map(f1, output_schema, name=_part(name, 1))
                .union(self.second.flat_map(f2, output_schema, name=_part(name, 2)), name=name))

    def key_by(self, key1: str | tuple[str, ...] | list[str], key2: str | tuple[str, ...] | list[str],
               *, name: str | None = None) -> "ConnectedKeyedStreams":
        """Key both streams: ``key1`` fields of the first, ``key2`` of the second, paired in order."""
        step = name or "connect"
        k1, k2 = _keys(key1, "first", step), _keys(key2, "second", step)
        if len(k1) != len(k2):
            raise PipelineError(f"connect key_by: {len(k1)} key fields on the first stream, {len(k2)} on the second", step)
        return ConnectedKeyedStreams(self.first.key_by(*k1), self.second.key_by(*k2), k1, k2, self.stream_type)


class ConnectedKeyedStreams:
    """Both streams keyed: ``process(KeyedCoProcessFunction, output_schema)``."""

    def __init__(self, first: Any, second: Any, keys1: tuple[str, ...], keys2: tuple[str, ...], stream_type: type) -> None:
        self.first, self.second, self.keys1, self.keys2 = first, second, keys1, keys2
        self.stream_type = stream_type

    def process(self, fn: KeyedCoProcessFunction, output_schema: Any, *, dead_letter: Any = None,
                name: str | None = None) -> Any:
        """Run ``fn`` on both streams' records with shared keyed state and timers (see
        :class:`~ember.functions.KeyedCoProcessFunction`); ``output_schema`` types what it yields.
        ``dead_letter=OutputTag(...)``: a record ``process_element1``/``2`` raises on goes to that
        side output (``raw``: the record as its stream had it, ``error``: the step, the method
        and the exception), as does a timer ``on_timer`` raises on; what the failed call emitted
        is discarded, the state and timers it changed stay changed. Without it, the job fails."""
        step = name or "co_process"
        if not isinstance(fn, KeyedCoProcessFunction):
            raise PipelineError(f"process takes a KeyedCoProcessFunction instance, got {fn!r}", step)
        if not output_schema:
            raise PipelineError("process needs an output_schema (Spark DDL string or StructType)", step)
        node = self.first._add(n.CoProcessNode, name, "co_process", inputs=(self.first.node, self.second.node),
                               keys=self.keys1, other_keys=self.keys2, fn=fn, output_schema=output_schema,
                               dead_letter=optional_dead_letter_tag(dead_letter, "process dead_letter", name))
        return self.stream_type(self.first._env, node)
