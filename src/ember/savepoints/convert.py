"""Restoring a savepoint into another state layout (``state_layout="blob"`` <-> ``"delta"``).

A job restored from a savepoint with a state layout other than the one the savepoint's
keyed steps hold is converted on the way (``restore_savepoint``): the new checkpoint
starts a new Spark query whose first micro-batch hands every keyed step its state in
the new layout, its sources positioned where the savepoint left them and its watermark
the savepoint's (the runner's half: runner/spark/conversion.py). Nothing is read twice or
skipped, and the keyed steps continue with the same keys, values and timers.

What a conversion needs, checked before anything is copied (else refused, naming it):

- every stateful step of the job on Ember's keyed runtime (process functions and what runs
  as one — co-process steps, CEP, rolling aggregations —, Python windows, vectorised steps,
  broadcast steps, window joins and interval joins on Ember's runtime; alone, chained, or as
  lanes of a fan-out): the state of Spark's own operators (native windows, SQL, Spark's
  stream-stream joins) cannot be handed to a new query;
- every source one of Ember's own readers (scripted, Redis streams, generators on Ember's
  sequence source), which can start at a given position; Spark's file and rate readers cannot;
- the savepoint's parallelism (restore first, then rescale with another savepoint), and
  the RocksDB state backend.

The converted steps run on ``transformWithStateInPandas`` (the only Spark operator that
takes initial state), which the checkpoint then keeps.
"""

from __future__ import annotations

import copy
from typing import Any

from ember.errors import SavepointError
from ember.graph.graph import Graph
from ember.runner.spark.checkpoint import GROUP_TIMEOUTS, GROUP_TIMEOUTS_WHERE_NEEDED
from ember.runner.spark.placement import TWS

__all__ = ["layout_changes", "as_converted", "check_convertible", "converted_manifest", "CONVERTIBLE_KINDS"]

CONVERTIBLE_KINDS = ("process function", "window", "vectorised process function", "broadcast process function",
                     "window join", "keyed interval join")
_LAYOUT_FIELDS = ("state layout", "spark operator")


def layout_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The steps whose state layout differs between the savepoint's manifest and the pipeline's
    (same position and kind; a renamed step is compared as restore_savepoint compares it)."""
    changed = []
    for old, new in zip(stored.get("operators", []), current["operators"]):
        if old["kind"] == new["kind"] and old.get("state layout", "blob") != new.get("state layout", "blob"):
            changed.append(new["name"])
    return changed


def as_converted(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """``stored`` with each keyed step's layout and Spark operator as ``current`` has them: what
    is left to compare once the conversion is granted."""
    out = copy.deepcopy(stored)
    for old, new in zip(out.get("operators", []), current["operators"]):
        if old["kind"] == new["kind"]:
            for field in _LAYOUT_FIELDS:
                old.pop(field, None)
                if field in new:
                    old[field] = new[field]
    return out


def check_convertible(path: str, manifest: dict[str, Any], graph: Graph, parallelism: int | None,
                      state_backend: str = "rocksdb") -> None:
    """Raise :class:`SavepointError` listing why the savepoint at ``path`` cannot be restored
    into another state layout (the module's doc says what a conversion needs)."""
    from ember.connectors.generators import GeneratorSource
    from ember.connectors.spark_sources import FileSource, RateSource

    problems = []
    for op in manifest["pipeline"]["operators"]:
        if op["kind"] not in CONVERTIBLE_KINDS:
            article = "an" if op["kind"][0] in "aeiou" else "a"
            problems.append(f"'{op['name']}' is {article} {op['kind']}: its state cannot be handed to a new query yet "
                            "(Spark's own operators take no initial state: a conversion carries the state of steps on "
                            "Ember's keyed runtime)")
    for node in graph.sources:
        src = node.source
        if isinstance(src, FileSource | RateSource) or (isinstance(src, GeneratorSource) and not src.needs_python_driver):
            problems.append(f"source '{node.name}' ({type(src).__name__}) is read by Spark's own reader, which cannot "
                            "start at the savepoint's position")
    if state_backend != "rocksdb":
        problems.append(f"state_backend={state_backend!r}: the converted steps run on transformWithStateInPandas, "
                        "which needs 'rocksdb'")
    saved = manifest.get("partitions")
    if parallelism is not None and saved and parallelism != saved:
        problems.append(f"parallelism {parallelism} differs from the savepoint's {saved}: restore with {saved} first "
                        "(the converted job can be rescaled with a savepoint of its own)")
    if problems:
        listed = "\n  - ".join(problems)
        raise SavepointError(
            f"the savepoint {path} holds its keyed state in another layout than this pipeline's state_layout, and "
            f"cannot be converted:\n  - {listed}\nRestore it with the layout it has (state_layout="
            f"'{_held_layout(manifest)}'), or start the new layout from a new checkpoint directory."
        )


def _held_layout(manifest: dict[str, Any]) -> str:
    held = {op.get("state layout", "blob") for op in manifest["pipeline"]["operators"] if op["kind"] in CONVERTIBLE_KINDS}
    return held.pop() if len(held) == 1 else "blob"


def converted_manifest(current: dict[str, Any]) -> dict[str, Any]:
    """The converted checkpoint's pipeline manifest: the pipeline's, every keyed step on
    ``transformWithStateInPandas`` (kept by later restarts: placement.spark_keyed_operator)."""
    out = copy.deepcopy(current)
    for op in out["operators"]:
        if "spark operator" in op:
            op["spark operator"] = TWS
    out[GROUP_TIMEOUTS] = GROUP_TIMEOUTS_WHERE_NEEDED
    return out
