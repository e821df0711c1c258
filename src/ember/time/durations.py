"""Conversion of user-given durations, done once at the edge.

Ember's convention: a duration is a :class:`datetime.timedelta`, or a bare number
of **milliseconds** (window sizes, lateness, intervals, TTLs: ``to_ms``). The
time limits of a run are the one place seconds are natural; they take a
timedelta or a parameter whose name says seconds (``duration_s``): ``seconds_of``.
"""

from __future__ import annotations

import numbers
import warnings
from datetime import timedelta

from ember.errors import ConfigError

__all__ = ["to_ms", "seconds_of"]


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


def seconds_of(value: timedelta | float | None, seconds: float | None, what: str) -> float | None:
    """A run's time limit in seconds, from ``what`` (a timedelta) or ``what_s`` (seconds);
    None when neither is given.

    A bare number given as ``what`` is still read as seconds, as before, with a
    DeprecationWarning: every other bare duration in Ember is milliseconds."""
    if value is not None and seconds is not None:
        raise ConfigError(f"give {what} (a timedelta) or {what}_s (seconds), not both")
    if value is not None:
        if isinstance(value, timedelta):
            seconds = value.total_seconds()
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            warnings.warn(
                f"{what}={value!r}: a bare number here is seconds, unlike Ember's other durations (milliseconds); "
                f"pass {what}=timedelta(seconds={value!r}) or {what}_s={value!r}",
                DeprecationWarning, stacklevel=3,
            )
            seconds = float(value)
        else:
            raise ConfigError(f"{what} must be a timedelta, got {value!r}")
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or seconds <= 0:
        raise ConfigError(f"{what}_s must be a positive number of seconds, got {seconds!r}")
    return float(seconds)
