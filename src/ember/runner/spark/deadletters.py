"""Dead-letter side outputs: the combined frame a step with dead letters produces.

Main records carry ``TAG`` = null and null dead-letter columns; a dead letter
carries ``TAG`` = the tag's name, nulls in the main columns, and ``raw`` (the
input as text) and ``error`` (why). The compiler splits the frame like any step
with side outputs. A dead-letter output must be read by the pipeline.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from ember.errors import PipelineError
from ember.graph.nodes import Node, SideOutputNode
from ember.runner.spark.keyed.runtime import TAG, side_column

__all__ = ["DEAD_LETTER_STRUCT", "require_reader", "read_dead_letters", "combined_struct", "main_batch", "dead_batch"]

DEAD_LETTER_STRUCT = T.StructType([T.StructField("raw", T.StringType()), T.StructField("error", T.StringType())])


def require_reader(comp: Any, node: Node, tag: Any, step: Node | None = None) -> None:
    """Fails the job before it starts when ``tag``'s dead letters are read by nothing;
    records it as a side output of ``node`` otherwise. ``step``: the chained step of
    ``node`` (a ChainedProcessNode) whose dead letters these are, named in the error."""
    for consumer in comp.graph.nodes:
        if isinstance(consumer, SideOutputNode) and consumer.inputs[0] is node and consumer.tag == tag:
            comp.side_types.setdefault(id(node), {})[tag.name] = DEAD_LETTER_STRUCT
            return
    raise PipelineError(
        f"its dead letters go to side output '{tag.name}', which the pipeline does not read; "
        f"add stream.get_side_output({tag.name}).sink_to(...) so no bad record is lost unnoticed",
        (step or node).name,
    )


def dead_letter_tags(node: Node) -> set[str]:
    """The names of ``node``'s dead-letter outputs: its own, or each chained step's."""
    steps = getattr(node, "steps", None) or (node,)
    tags = (getattr(s, "dead_letter", None) for s in steps)
    return {t.name for t in tags if t is not None}


def read_dead_letters(comp: Any, node: Node, step: Node | None = None) -> str | None:
    """The name of ``node``'s dead-letter output (its reader required: :func:`require_reader`),
    or None when the step has none; with ``step``, of that chained step of ``node``."""
    tag = getattr(step or node, "dead_letter", None)
    if tag is None:
        return None
    require_reader(comp, node, tag, step)
    return str(tag.name)


def combined_struct(main: T.StructType, tag: str) -> T.StructType:
    return T.StructType(
        list(main.fields)
        + [T.StructField(TAG, T.StringType()), T.StructField(side_column(tag, "raw"), T.StringType()),
           T.StructField(side_column(tag, "error"), T.StringType())]
    )


def main_batch(columns: list[pa.Array], schema: pa.Schema) -> pa.RecordBatch:
    """The main records (``columns`` of the main fields) in the combined ``schema``."""
    n = len(columns[0]) if columns else 0
    return pa.RecordBatch.from_arrays(list(columns) + [pa.nulls(n, pa.string())] * 3, schema=schema)


def dead_batch(schema: pa.Schema, tag: str, raws: list[str | None] | pa.Array, errors: list[str]) -> pa.RecordBatch:
    n = len(errors)
    cols = [pa.nulls(n, f.type) for f in list(schema)[: len(schema) - 3]]
    raw = raws if isinstance(raws, pa.Array) else pa.array(raws, pa.string())
    cols += [pa.array([tag] * n, pa.string()), raw, pa.array(errors, pa.string())]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


