"""Broadcast state (Flink's dynamic-rules pattern).

``rules.broadcast(MapStateDescriptor("rules"))`` turns a stream into a
:class:`BroadcastStream`; ``events.key_by(k).connect(that)`` gives a
:class:`BroadcastConnectedStream`, and ``.process(KeyedBroadcastProcessFunction, schema)``
runs the function with keyed state for the events and the broadcast MapStates, written by
the rules, read by the events (ember.functions); ``events.connect(that)`` on a non-keyed
stream takes a ``BroadcastProcessFunction`` (broadcast state only). Like ember.api.connected, this module
gets the stream class handed in, so the API's modules import one way.
"""

from __future__ import annotations

from typing import Any

from ember.api.dead_letters import optional_dead_letter_tag
from ember.errors import PipelineError
from ember.functions import BroadcastProcessFunction, KeyedBroadcastProcessFunction
from ember.graph import nodes as n
from ember.state.descriptors import MapStateDescriptor

__all__ = ["BroadcastStream", "BroadcastConnectedStream", "broadcast_descriptors"]


def broadcast_descriptors(descriptors: tuple[Any, ...], step: str) -> tuple[MapStateDescriptor, ...]:
    """``descriptors`` checked: at least one, all MapStateDescriptors, no TTL, distinct names."""
    if not descriptors:
        raise PipelineError("broadcast needs the broadcast state it fills: broadcast(MapStateDescriptor('name'))", step)
    for d in descriptors:
        if not isinstance(d, MapStateDescriptor):
            raise PipelineError(f"broadcast state is a MapStateDescriptor, got {d!r}", step)
        if d.ttl is not None:
            raise PipelineError(f"broadcast state '{d.name}' cannot have a TTL (it is not per key)", step)
    names = [d.name for d in descriptors]
    if len(set(names)) != len(names):
        raise PipelineError(f"broadcast state names must differ, got {names}", step)
    return tuple(descriptors)


class BroadcastStream:
    """A stream whose records reach every task, with the broadcast state they fill;
    only ``stream.connect(broadcast_stream)`` reads it."""

    def __init__(self, stream: Any, descriptors: tuple[MapStateDescriptor, ...]) -> None:
        self.stream = stream
        self.descriptors = descriptors

    def __repr__(self) -> str:
        return f"BroadcastStream({self.stream.node.name!r}, {[d.name for d in self.descriptors]})"


class BroadcastConnectedStream:
    """``stream.connect(broadcast_stream)``: waiting for ``process`` (a keyed stream's takes a
    KeyedBroadcastProcessFunction, a non-keyed one's a BroadcastProcessFunction)."""

    def __init__(self, stream: Any, broadcast: BroadcastStream, stream_type: type) -> None:
        if getattr(broadcast.stream, "_env", None) is not stream._env:
            raise PipelineError("cannot connect streams of different environments", "connect")
        self.stream, self.broadcast, self.stream_type = stream, broadcast, stream_type
        self.keys = tuple(getattr(stream, "keys", ()))  # none: a non-keyed stream

    def process(self, fn: KeyedBroadcastProcessFunction | BroadcastProcessFunction, output_schema: Any, *,
                dead_letter: Any = None, name: str | None = None) -> Any:
        """Run ``fn``: ``process_element`` per record of the stream (broadcast state read-only;
        a keyed stream's with keyed state and timers), ``process_broadcast_element`` per
        broadcast record (broadcast state read-write); ``output_schema`` types what both yield.
        ``dead_letter=OutputTag(...)``: a record either method raises on (or a timer
        ``on_timer`` raises on) goes to that side output once, as for a keyed ``process``; a
        broadcast record's state changes before the raise stay, alike in every copy."""
        step = name or "broadcast_process"
        wanted = KeyedBroadcastProcessFunction if self.keys else BroadcastProcessFunction
        if not isinstance(fn, wanted):
            hint = ("" if self.keys or not isinstance(fn, KeyedBroadcastProcessFunction)
                    else " (a KeyedBroadcastProcessFunction needs a keyed stream: key_by(...) before connect)")
            raise PipelineError(f"process takes a {wanted.__name__} instance, got {fn!r}{hint}", step)
        if not output_schema:
            raise PipelineError("process needs an output_schema (Spark DDL string or StructType)", step)
        stream = self.stream
        node = stream._add(n.BroadcastProcessNode, name, "broadcast_process", inputs=(stream.node, self.broadcast.stream.node),
                           keys=self.keys, fn=fn, output_schema=output_schema, descriptors=self.broadcast.descriptors,
                           dead_letter=optional_dead_letter_tag(dead_letter, "process dead_letter", name))
        return self.stream_type(stream._env, node)
