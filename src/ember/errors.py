"""Ember's errors: one root class, a few meaningful subclasses.

Every error raised for bad user input names the pipeline step (when there is
one), the bad value and what would be valid.
"""

from __future__ import annotations

__all__ = [
    "EmberError",
    "ConfigError",
    "PipelineError",
    "UserFunctionError",
    "JobFailedError",
    "LatencyTargetError",
    "RestartError",
    "SavepointError",
]


class EmberError(Exception):
    """Root of every error Ember raises on purpose."""


class ConfigError(EmberError, ValueError):
    """A configuration value (environment, source, sink, window) is invalid."""


class PipelineError(EmberError):
    """The pipeline graph is invalid or cannot be compiled; raised before the job starts."""

    def __init__(self, message: str, step: str | None = None) -> None:
        self.step = step
        super().__init__(f"step '{step}': {message}" if step else message)


class UserFunctionError(EmberError):
    """A user function raised while processing a record."""


class JobFailedError(EmberError):
    """The running Spark query failed; the message carries Spark's cause."""


class RestartError(EmberError):
    """The checkpoint (or savepoint) was written by a pipeline this one cannot continue."""


class SavepointError(EmberError):
    """A savepoint cannot be created, read or restored (the message says why)."""


class LatencyTargetError(ConfigError):
    """The job cannot keep its ``latency_target``: even its smallest batches take too long."""
