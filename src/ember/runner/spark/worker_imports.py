"""``python -m ember.runner.spark.worker_imports``: Spark's Python processes import the
installed pyspark, with its bytecode cache, instead of the zip archive bundled inside it.

Spark starts each Python process it spawns — a Python data source's runner (one per
Python source at every query start), the planner of its reads, the UDF worker daemon —
with ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on ``PYTHONPATH``.
Python never caches the bytecode of modules it imports from a zip, so every such process
compiles pyspark from source: ~1.0-1.2 s on this machine against ~0.4 s from
site-packages (docs/design/latency.md, "Python process start"). A job with a scripted
source and event time starts two runners before its first micro-batch.

When pyspark is pip-installed, ``SPARK_HOME`` is the package itself and the archive is a
copy of the package beside it. ``install()`` writes a ``.pth`` file into that
site-packages: at interpreter start it drops the archive entries of *this* installation
from ``sys.path`` (nothing else), so the process imports the same pyspark and py4j from
site-packages. ``make venv`` runs it; a pyspark that is not pip-installed (a Spark
distribution's ``SPARK_HOME``) is left alone. The same file quiets the one Spark process that
prints its internals on every query start (CHATTY_WORKERS).
"""

from __future__ import annotations

import os
import sys

__all__ = ["install", "archive_dir", "pth_line", "PTH_NAME", "KEEP_ZIPS", "CHATTY_WORKERS"]

PTH_NAME = "ember-spark-workers.pth"


def archive_dir() -> str | None:
    """``<site-packages>/pyspark/python/lib`` of the installed pyspark when it holds Spark's
    worker archive (a pip install), else None."""
    import pyspark

    lib = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "python", "lib")
    return lib if os.path.isfile(os.path.join(lib, "pyspark.zip")) else None


KEEP_ZIPS = "EMBER_SPARK_ZIP_IMPORTS"  # set to 1: keep Spark's archives (to measure the difference)


# Spark 4.3's driver-side process of a transformWithStateInPandas query prints what it does —
# four lines, the UDF's whole return type among them — for every such operator at every query
# start, onto the job's stderr. It talks to the JVM over a socket; its stdout carries nothing else.
CHATTY_WORKERS = ("pyspark.sql.streaming.transform_with_state_driver_worker",)


def pth_line(lib: str) -> str:
    """The ``.pth`` lines: drop the zip archives under ``lib`` from ``sys.path`` (unless
    ``$EMBER_SPARK_ZIP_IMPORTS`` is 1: benchmarks/job_overhead.py measures both), and send the
    stdout of the CHATTY_WORKERS processes to ``os.devnull``."""
    prefix = os.path.join(lib, "")
    return (f"import os, sys; sys.path[:] = sys.path if os.environ.get({KEEP_ZIPS!r}) == '1' else "
            f"[p for p in sys.path if not (p.startswith({prefix!r}) and p.endswith('.zip'))]\n"
            f"import os, sys; sys.stdout = open(os.devnull, 'w') if any(m in sys.orig_argv for m in {CHATTY_WORKERS!r}) "
            f"else sys.stdout\n")


def install() -> str | None:
    """Write the ``.pth`` file beside the installed pyspark; its path, or None when pyspark
    is not pip-installed (nothing to do)."""
    lib = archive_dir()
    if lib is None:
        return None
    site = os.path.dirname(os.path.dirname(os.path.dirname(lib)))  # <site>/pyspark/python/lib
    path = os.path.join(site, PTH_NAME)
    with open(path, "w") as f:
        f.write(pth_line(lib))
    return path


def main() -> None:
    path = install()
    if path is None:
        print("pyspark is not pip-installed here: Spark's workers keep its own PYTHONPATH", file=sys.stderr)
    else:
        print(f"Spark's Python workers import the installed pyspark ({path})")


if __name__ == "__main__":
    main()
