"""The Spark runner: the only package that drives Spark."""

from ember.runner.spark.worker_gc import install as _young_collections_after_tasks

_young_collections_after_tasks()  # in Spark's Python workers only (worker_gc.py)
