"""Runners turn the pipeline graph into execution. Ember has one: Spark Structured Streaming."""
