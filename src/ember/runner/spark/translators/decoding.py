"""Dead-letter steps: ``parse_json`` (vectorised JSON decoding) and the unmatched
records of ``join_lookup``.

Both produce a combined frame — the main records with ``TAG`` null, dead letters
with ``TAG`` = the tag's name and the ``raw`` / ``error`` side columns — which
the compiler splits like any step with side outputs. A dead-letter output must
be read by the pipeline: a bad record is never dropped unnoticed.
"""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.types import _parse_datatype_string

from ember.errors import PipelineError
from ember.graph.nodes import LookupJoinNode, ParseJsonNode
from ember.runner.spark.compiler import Compilation, Frame, translates
from ember.runner.spark.deadletters import combined_struct, dead_batch, main_batch, require_reader
from ember.runner.spark.keyed.runtime import TAG, side_column
from ember.runner.spark.translators.python_ops import arrow_schema

__all__ = ["lookup_with_unmatched"]

@translates(ParseJsonNode)
def _parse_json(comp: Compilation, node: ParseJsonNode) -> Frame:
    from ember.runner.spark.json_decode import decode_json

    up = comp.frame(node.inputs[0])
    types = {f.name: f.dataType for f in up.df.schema.fields}
    if node.field not in types:
        raise PipelineError(f"field '{node.field}' is not in the stream (fields: {', '.join(types)})", node.name)
    if not isinstance(types[node.field], T.StringType | T.BinaryType):
        raise PipelineError(f"field '{node.field}' holds {types[node.field].simpleString()}, not JSON text", node.name)
    rest = [f for f in up.df.schema.fields if f.name != node.field]
    clash = {f.name for f in rest} & {name for name, _, _ in node.fields}
    if clash:
        raise PipelineError(f"decoded field(s) {sorted(clash)} already exist in the stream; rename them first", node.name)
    require_reader(comp, node, node.dead_letter)
    tag, fields, text_field = node.dead_letter.name, node.fields, node.field
    decoded = [T.StructField(name, _parse_datatype_string(kind), True) for name, kind, _ in fields]  # kinds checked when declared
    out = combined_struct(T.StructType(rest + decoded), tag)
    schema = arrow_schema(out)
    rest_names = [f.name for f in rest]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            texts = batch.column(text_field)
            decoded, good, reasons = decode_json(texts, fields)
            if decoded.num_rows:
                keep = pa.array(good)
                yield main_batch(
                    [batch.column(c).filter(keep) for c in rest_names]
                    + [decoded.column(i).combine_chunks() for i in range(decoded.num_columns)],
                    schema,
                )
            if reasons:
                index = sorted(reasons)
                raw = texts.take(pa.array(index))
                if not pa.types.is_string(raw.type):
                    raw = pa.array([None if v is None else v.decode("utf-8", "replace") for v in raw.to_pylist()],
                                   pa.string())
                yield dead_batch(schema, tag, raw, [reasons[i] for i in index])

    return Frame(up.df.mapInArrow(run, out), up.time)


def lookup_with_unmatched(comp: Compilation, node: LookupJoinNode, stream: Any, table: Any) -> Any:
    """An inner lookup join whose records without a match become dead letters."""
    require_reader(comp, node, node.unmatched)
    marker = "__ember_matched"
    tag = node.unmatched.name
    joined = stream.join(F.broadcast(table.withColumn(marker, F.lit(True))), list(node.on), "left")
    missing = F.col(marker).isNull()
    keys = ", ".join(node.on)
    error = F.concat(F.lit(f"no match in the lookup table for {keys} = "), F.to_json(F.struct(*[F.col(k) for k in node.on])))
    return joined.select(
        *[c for c in joined.columns if c != marker],
        F.when(missing, F.lit(tag)).alias(TAG),
        F.when(missing, F.to_json(F.struct(*[F.col(c) for c in stream.columns]))).alias(side_column(tag, "raw")),
        F.when(missing, error).alias(side_column(tag, "error")),
    )
