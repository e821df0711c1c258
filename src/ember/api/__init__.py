"""What users write: the environment, streams and their operations."""

from ember.api.datastream import DataStream, KeyedStream, WindowedStream
from ember.api.environment import JobResult, StreamEnvironment

__all__ = ["StreamEnvironment", "JobResult", "DataStream", "KeyedStream", "WindowedStream"]
