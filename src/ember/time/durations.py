"""Conversion of user-given durations to integer milliseconds, done once at the edge."""

from __future__ import annotations

import numbers
from datetime import timedelta

from ember.errors import ConfigError

__all__ = ["to_ms"]


def to_ms(value: timedelta | int, what: str, *, allow_zero: bool = False) -> int:
    """Return ``value`` as whole milliseconds.

    ``value`` is a :class:`datetime.timedelta` or a number of milliseconds.
    ``what`` names the parameter in the error message.
    """
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"{what} must be a timedelta or milliseconds (int), got {value!r}")
    if isinstance(value, timedelta):
        ms = value / timedelta(milliseconds=1)
    elif isinstance(value, numbers.Real):
        ms = float(value)
    else:
        raise ConfigError(f"{what} must be a timedelta or milliseconds (int), got {value!r}")
    if ms != int(ms):
        raise ConfigError(f"{what} must be a whole number of milliseconds, got {value!r}")
    ms = int(ms)
    if ms < 0 or (ms == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{what} must be {bound} ms, got {value!r}")
    return ms
