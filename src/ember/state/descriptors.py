"""State descriptors: small immutable declarations of a function's keyed state.

A descriptor names a piece of per-key state and, optionally, its time to live.
The runner builds the state object that executes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from ember.errors import ConfigError
from ember.time.durations import to_ms

__all__ = [
    "StateTtlConfig",
    "StateDescriptor",
    "ValueStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "AggregatingStateDescriptor",
]

_UPDATE_ON = ("create_and_write", "read_and_write")
# What an aggregate function has (ember.functions.AggregateFunction, which sits above this module).
_AGGREGATE_METHODS = ("create_accumulator", "add", "merge", "get_result")


@dataclass(frozen=True)
class StateTtlConfig:
    """Per-key state expires ``ttl`` after it was last written (or, with
    ``update_on="read_and_write"``, also read). Time is processing time: the
    micro-batch's timestamp, which Spark logs, so a replayed batch sees the same
    time. Expired state is never returned; it is removed when its key is next
    touched and whenever its bucket's state is written."""

    ttl_ms: int
    update_on: str = "create_and_write"

    @staticmethod
    def of(ttl: timedelta | int, update_on: str = "create_and_write") -> "StateTtlConfig":
        if update_on not in _UPDATE_ON:
            raise ConfigError(f"update_on must be one of {', '.join(_UPDATE_ON)}, got {update_on!r}")
        return StateTtlConfig(to_ms(ttl, "state ttl"), update_on)


@dataclass(frozen=True)
class StateDescriptor:
    name: str
    ttl: StateTtlConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"state name must be a non-empty string, got {self.name!r}")
        if self.ttl is not None and not isinstance(self.ttl, StateTtlConfig):
            raise ConfigError(f"state '{self.name}': ttl must be a StateTtlConfig, got {self.ttl!r}")


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    """One value per key; ``value()`` returns ``default`` for a key without state."""

    default: Any = None


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list of values per key."""


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A dict per key."""


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor):
    """One value per key, combined with ``reduce_fn(old, new)`` on every ``add``."""

    reduce_fn: Callable[[Any, Any], Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_fn):
            raise ConfigError(f"state '{self.name}': reduce_fn must be callable, got {self.reduce_fn!r}")


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor):
    """An accumulator per key driven by an :class:`~ember.functions.AggregateFunction`
    (any object with its four methods)."""

    aggregate_fn: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        missing = [m for m in _AGGREGATE_METHODS if not callable(getattr(self.aggregate_fn, m, None))]
        if missing:
            raise ConfigError(
                f"state '{self.name}': aggregate_fn must be an AggregateFunction "
                f"({', '.join(_AGGREGATE_METHODS)}), got {self.aggregate_fn!r} without {', '.join(missing)}"
            )
