"""Make user code travel to Spark's Python workers.

cloudpickle pickles a function or class *by reference* when its module can be
imported, and the worker imports that module by name. A job file loaded by
``ember run``, a test module or a notebook helper is importable on the driver
only, so the worker fails with ``ModuleNotFoundError``. Modules that are not
part of an installed package are therefore registered to be pickled *by
value* (their code is shipped with the function).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from typing import Any

__all__ = ["ship_by_value"]

_INSTALLED_ROOTS = tuple(
    os.path.realpath(p)
    for p in {*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
    if p
)


def ship_by_value(obj: Any, _depth: int = 6) -> None:
    """Register the modules defining ``obj`` (a function, a class or an instance) and its
    class for pickling by value, unless they are installed (site-packages, the standard
    library), Ember's or PySpark's own, or ``__main__`` (cloudpickle ships that anyway).
    Ember's own objects, and the tuples, lists and dicts they hold, are searched for user
    objects (a window's trigger, aggregate function, a purging trigger's inner trigger, a
    CEP pattern's conditions...)."""
    from pyspark import cloudpickle

    if obj is None or isinstance(obj, str | int | float | bool | bytes):
        return
    if _depth and isinstance(obj, tuple | list | frozenset | set):
        for value in obj:
            ship_by_value(value, _depth - 1)
        return
    if _depth and isinstance(obj, dict):
        for value in obj.values():
            ship_by_value(value, _depth - 1)
        return
    if _depth and type(obj).__module__.split(".")[0] == "ember":
        for value in getattr(obj, "__dict__", {}).values():
            ship_by_value(value, _depth - 1)
    for name in {getattr(obj, "__module__", None), type(obj).__module__}:
        if not name or name == "__main__" or name.split(".")[0] in ("ember", "builtins", "pyspark"):
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if path is None or os.path.realpath(path).startswith(_INSTALLED_ROOTS):
            continue
        cloudpickle.register_pickle_by_value(sys.modules[name])
