"""The keyed state objects a function gets from ``ctx.get_state(descriptor)``.

Each descriptor of :mod:`ember.state.descriptors` declares one of these; the
runner supplies the object that executes it, always bound to the key of the
record (or timer) being processed. These classes document the contract and are
the base classes of the runner's implementations.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["State", "ValueState", "ListState", "MapState", "ReducingState", "AggregatingState"]


class State:
    """A named piece of the current key's state."""

    __slots__ = ()

    def clear(self) -> None:
        """Remove the current key's value of this state."""
        raise NotImplementedError


class ValueState(State):
    """One value per key (``ValueStateDescriptor``)."""

    __slots__ = ()

    def value(self) -> Any:
        """The current key's value, or the descriptor's ``default`` when it has none."""
        raise NotImplementedError

    def update(self, value: Any) -> None:
        raise NotImplementedError


class ListState(State):
    """A list of values per key (``ListStateDescriptor``)."""

    __slots__ = ()

    def get(self) -> list[Any]:
        """A copy of the current key's list ([] when it has none)."""
        raise NotImplementedError

    def add(self, value: Any) -> None:
        raise NotImplementedError

    def add_all(self, values: Iterable[Any]) -> None:
        raise NotImplementedError

    def update(self, values: Iterable[Any]) -> None:
        """Replace the list (an empty one clears the state)."""
        raise NotImplementedError


class MapState(State):
    """A dict per key (``MapStateDescriptor``)."""

    __slots__ = ()

    def get(self, key: Any, default: Any = None) -> Any:
        raise NotImplementedError

    def put(self, key: Any, value: Any) -> None:
        raise NotImplementedError

    def put_all(self, entries: dict[Any, Any]) -> None:
        raise NotImplementedError

    def remove(self, key: Any) -> None:
        raise NotImplementedError

    def contains(self, key: Any) -> bool:
        raise NotImplementedError

    def keys(self) -> list[Any]:
        raise NotImplementedError

    def values(self) -> list[Any]:
        raise NotImplementedError

    def items(self) -> list[tuple[Any, Any]]:
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError


class ReducingState(State):
    """One value per key, combined with the descriptor's ``reduce_fn`` on every ``add``."""

    __slots__ = ()

    def get(self) -> Any:
        """The reduced value (None when the key has none)."""
        raise NotImplementedError

    def add(self, value: Any) -> None:
        raise NotImplementedError


class AggregatingState(State):
    """An accumulator per key driven by the descriptor's ``AggregateFunction``."""

    __slots__ = ()

    def get(self) -> Any:
        """``get_result`` of the key's accumulator (None when the key has none)."""
        raise NotImplementedError

    def add(self, value: Any) -> None:
        raise NotImplementedError
