"""What users write: the environment, streams and their operations."""

from ember.api.environment import JobResult, StreamEnvironment
from ember.api.datastream import DataStream, KeyedStream, WindowedStream

__all__ = ["StreamEnvironment", "JobResult", "DataStream", "KeyedStream", "WindowedStream"]
