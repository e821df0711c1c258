"""The Spark runner: the only package that drives Spark."""
