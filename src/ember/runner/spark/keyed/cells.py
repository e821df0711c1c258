"""State cells: the objects ``ctx.get_state(descriptor)`` returns inside a keyed step.

Each cell is one named state of the *current* key: it reads and writes the
key's slot (``holder.current``, a dict) in the bucket state the runtime holds,
so a cell is created once per task and follows whichever key is current. With
a TTL, the stored value is ``(value, last written or read ms)`` and expired
values read as absent (``holder.now`` is the batch's processing time).
"""

from __future__ import annotations

from typing import Any, Protocol

from ember.errors import UserFunctionError
from ember.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from ember.state.interfaces import AggregatingState, ListState, MapState, ReducingState, State, ValueState

__all__ = ["SlotHolder", "state_object", "read_only"]

_ABSENT = object()


class SlotHolder(Protocol):
    """What a cell reads: the current key's slot and the batch's processing time."""

    @property
    def current(self) -> dict[str, Any]: ...

    @property
    def now(self) -> int: ...


class _State(State):
    """One named state of the current key. With a TTL, the stored value is
    ``(value, last written or read ms)`` and expired values read as absent."""

    __slots__ = ("_rt", "_name", "_ttl_ms", "_touch_on_read")

    def __init__(self, rt: SlotHolder, d: StateDescriptor) -> None:
        self._rt, self._name = rt, d.name
        self._ttl_ms = d.ttl.ttl_ms if d.ttl else None
        self._touch_on_read = bool(d.ttl and d.ttl.update_on == "read_and_write")

    def _get(self) -> Any:
        slot = self._rt.current
        stored = slot.get(self._name, _ABSENT)
        if stored is _ABSENT or self._ttl_ms is None:
            return stored
        value, touched = stored
        if self._rt.now - touched >= self._ttl_ms:
            del slot[self._name]
            return _ABSENT
        if self._touch_on_read:
            slot[self._name] = (value, self._rt.now)
        return value

    def _set(self, value: Any) -> None:
        self._rt.current[self._name] = value if self._ttl_ms is None else (value, self._rt.now)

    def clear(self) -> None:
        self._rt.current.pop(self._name, None)


class _Value(_State, ValueState):
    """A ValueState without TTL: the hot path of most process functions, one dict access each."""

    __slots__ = ("_default",)

    def __init__(self, rt: SlotHolder, d: ValueStateDescriptor) -> None:
        super().__init__(rt, d)
        self._default = d.default

    def value(self) -> Any:
        v = self._rt.current.get(self._name, _ABSENT)
        return self._default if v is _ABSENT else v

    def update(self, value: Any) -> None:
        self._rt.current[self._name] = value


class _TtlValue(_Value):
    """A ValueState with TTL: stored as ``(value, last written or read ms)`` (``_State._get``
    inlined: it runs once per record in a dedupe)."""

    __slots__ = ()

    def value(self) -> Any:
        rt = self._rt
        slot = rt.current
        stored = slot.get(self._name)  # a tuple when there (a stored None is (None, ms))
        if stored is None:
            return self._default
        value, touched = stored
        now = rt.now
        if now - touched >= self._ttl_ms:
            del slot[self._name]
            return self._default
        if self._touch_on_read:
            slot[self._name] = (value, now)
        return value

    def update(self, value: Any) -> None:
        rt = self._rt
        rt.current[self._name] = (value, rt.now)


class _List(_State, ListState):
    def get(self) -> list[Any]:
        v = self._get()
        return [] if v is _ABSENT else list(v)

    def add(self, value: Any) -> None:
        v = self._get()
        self._set([value] if v is _ABSENT else [*v, value])

    def add_all(self, values: Any) -> None:
        v = self._get()
        self._set(list(values) if v is _ABSENT else [*v, *values])

    def update(self, values: Any) -> None:
        values = list(values)
        self._set(values) if values else self.clear()


class _Map(_State, MapState):
    def _map(self) -> dict[Any, Any]:
        v = self._get()
        return {} if v is _ABSENT else v

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map().get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._set({**self._map(), key: value})

    def put_all(self, entries: dict[Any, Any]) -> None:
        self._set({**self._map(), **entries})

    def remove(self, key: Any) -> None:
        m = {k: v for k, v in self._map().items() if k != key}
        self._set(m) if m else self.clear()

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def is_empty(self) -> bool:
        return not self._map()


class _Reducing(_State, ReducingState):
    __slots__ = ("_fn",)

    def __init__(self, rt: SlotHolder, d: ReducingStateDescriptor) -> None:
        super().__init__(rt, d)
        assert d.reduce_fn is not None  # checked by the descriptor
        self._fn = d.reduce_fn

    def get(self) -> Any:
        v = self._get()
        return None if v is _ABSENT else v

    def add(self, value: Any) -> None:
        v = self._get()
        self._set(value if v is _ABSENT else self._fn(v, value))


class _Aggregating(_State, AggregatingState):
    __slots__ = ("_fn",)

    def __init__(self, rt: SlotHolder, d: AggregatingStateDescriptor) -> None:
        super().__init__(rt, d)
        self._fn = d.aggregate_fn

    def get(self) -> Any:
        v = self._get()
        return None if v is _ABSENT else self._fn.get_result(v)

    def add(self, value: Any) -> None:
        v = self._get()
        self._set(self._fn.add(value, self._fn.create_accumulator() if v is _ABSENT else v))


_STATE_KINDS: dict[type, type[_State]] = {
    ValueStateDescriptor: _Value,
    ListStateDescriptor: _List,
    MapStateDescriptor: _Map,
    ReducingStateDescriptor: _Reducing,
    AggregatingStateDescriptor: _Aggregating,
}


def state_object(holder: SlotHolder, descriptor: StateDescriptor) -> State:
    """The state object for ``descriptor`` reading ``holder.current`` / ``holder.now``."""
    kind = _STATE_KINDS.get(type(descriptor))
    if kind is None:
        raise UserFunctionError(f"get_state takes a state descriptor from ember.state, got {descriptor!r}")
    if kind is _Value and descriptor.ttl is not None:
        kind = _TtlValue
    return kind(holder, descriptor)


class _ReadOnlyMap(MapState):
    """A MapState seen read-only: broadcast state outside process_broadcast_element."""

    __slots__ = ("_cell", "_name")

    def __init__(self, cell: Any, name: str) -> None:
        self._cell, self._name = cell, name

    def get(self, key: Any, default: Any = None) -> Any:
        return self._cell.get(key, default)

    def contains(self, key: Any) -> bool:
        return bool(self._cell.contains(key))

    def keys(self) -> list[Any]:
        return list(self._cell.keys())

    def values(self) -> list[Any]:
        return list(self._cell.values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._cell.items())

    def is_empty(self) -> bool:
        return bool(self._cell.is_empty())

    def _refuse(self, *args: Any) -> None:
        raise UserFunctionError(
            f"broadcast state '{self._name}' is read-only here: write it in process_broadcast_element, which every task runs alike"
        )

    put = put_all = remove = clear = _refuse  # type: ignore[assignment]


def read_only(cell: State, name: str) -> State:
    """A read-only view of the MapState ``cell``."""
    return _ReadOnlyMap(cell, name)
