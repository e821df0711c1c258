"""The driver JVM's class archive (AppCDS): Spark's classes mapped from a file, not loaded anew.

A fresh driver spends seconds loading and verifying Spark's classes — in its session's start
and again in its first micro-batches (docs/design/latency.md, "Recovery after a driver kill").
Java 17 can dump the classes a run loaded into an archive (``-XX:ArchiveClassesAtExit``) and
map them from it at the next start (``-XX:SharedArchiveFile``). ``make venv`` builds one
(``python -m ember.tools.class_archive``: a short job of Ember's usual shape) and every
SparkSession Ember creates uses it, when it is there and complete.

One archive per installation: its name hashes PySpark's version and jars, the ``java`` Spark
would start and the configuration directories Spark puts first on the driver's class path
(``SPARK_CONF_DIR``, ``HADOOP_CONF_DIR``, ``YARN_CONF_DIR``), so another installation, JDK or
class path never picks up a foreign one (the JVM would refuse it anyway: it checks the class
path) — with one of those set, build the archive with it set the same way. An archive cut short makes the JVM crash
when it maps it, so one is written under a temporary name, renamed when whole, and used
only if its size is the one recorded beside it. ``EMBER_CLASS_ARCHIVE=off`` disables it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

__all__ = ["OFF_SWITCH", "archive_path", "java_options", "dump_options", "seal"]

OFF_SWITCH = "EMBER_CLASS_ARCHIVE"  # "off": no archive is used
# The archive's own warnings (e.g. one built by another JDK) would go to the user's stdout.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _cache_dir() -> Path:
    base = os.environ.get("EMBER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ember")
    return Path(base) / "jvm"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found else "java"


def archive_path() -> Path:
    """Where this installation's archive lives (whether or not it was built)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    java = _java()
    stamp = os.stat(java).st_mtime_ns if os.path.exists(java) else 0
    # The JVM's class path starts with these directories (Spark's launcher): one archive each.
    conf_dirs = [os.environ.get(name, "") for name in ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR")]
    key = json.dumps([pyspark.__version__, str(jars), listing, java, stamp, conf_dirs])
    return _cache_dir() / f"spark-{pyspark.__version__}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def _record(path: Path) -> Path:
    return path.with_suffix(".json")


def _usable(path: Path) -> bool:
    try:
        recorded = json.loads(_record(path).read_text())["bytes"]
        return path.stat().st_size == int(recorded)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def java_options() -> str:
    """The driver's JVM options that map the archive ("" when there is none, or it is off)."""
    if os.environ.get(OFF_SWITCH, "").lower() in ("off", "0", "false", "no"):
        return ""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {_QUIET}" if _usable(path) else ""


def dump_options(path: Path) -> str:
    """The JVM options of a run that writes its classes to ``path`` when it exits."""
    return f"-XX:ArchiveClassesAtExit={path} {_QUIET}"


def seal(written: Path, path: Path) -> int:
    """Make the archive ``written`` (its JVM has exited) this installation's: its size
    recorded, then renamed into place. Returns its size in bytes."""
    size = written.stat().st_size
    if size == 0:
        raise RuntimeError(f"the JVM wrote an empty class archive at {written}")
    _record(path).write_text(json.dumps({"bytes": size}))
    os.replace(written, path)
    return size
