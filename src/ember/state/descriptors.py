"""State descriptors: small immutable declarations of a function's keyed state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.errors import ConfigError

__all__ = ["ValueStateDescriptor"]


@dataclass(frozen=True)
class ValueStateDescriptor:
    """One value per key. ``default`` is what ``value()`` returns for a key without state."""

    name: str
    default: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"state name must be a non-empty string, got {self.name!r}")
