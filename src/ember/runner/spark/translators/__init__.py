"""Translators, one per graph node type; importing this package fills the table."""

from ember.runner.spark.translators import (  # noqa: F401
    coprocess,
    decoding,
    joins,
    keyed,
    python_ops,
    sinks,
    sources,
    sql,
    transforms,
    windows,
)
