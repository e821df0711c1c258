"""Dead-letter steps: ``parse_json`` (vectorised JSON decoding) and the unmatched
records of ``join_lookup``.

Both produce a combined frame — the main records with ``TAG`` null, dead letters
with ``TAG`` = the tag's name and the ``raw`` / ``error`` side columns — which
the compiler splits like any step with side outputs. A dead-letter output must
be read by the pipeline: a bad record is never dropped unnoticed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.types import _parse_datatype_string

from ember.errors import PipelineError
from ember.graph.nodes import FilterNode, LookupJoinNode, ParseJsonNode, SideOutputNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.deadletters import combined_struct, dead_batch, main_batch, require_reader
from ember.runner.spark.keyed.runtime import HIDDEN, TAG, side_column
from ember.runner.spark.translators.python_ops import arrow_schema

__all__ = ["lookup_with_unmatched", "DecodePlan", "decode_batches"]

@dataclass(frozen=True)
class DecodePlan:
    """What a ``parse_json`` step does to each Arrow batch, wherever it runs: in its
    own Python step, or fused into the Python source right before it. JSON-able."""

    field: str  # the JSON text field
    fields: tuple[tuple[str, str, bool], ...]  # declared (name, type, nullable)
    rest: tuple[str, ...]  # the stream's other fields, kept
    tag: str  # the dead-letter output
    output: str  # the Spark type (StructType.json()) of the batches produced (combined with dead letters unless spooled)
    spool: str | None = None  # detoured dead letters: their spool directory (spool.py)
    keep: tuple[str, tuple[str, ...]] | None = None  # (field, values): only records whose field is one of them

    @property
    def output_struct(self) -> T.StructType:
        return T.StructType.fromJson(json.loads(self.output))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DecodePlan":
        raw = json.loads(text)
        keep = raw.get("keep")
        return cls(raw["field"], tuple(tuple(f) for f in raw["fields"]), tuple(raw["rest"]), raw["tag"], raw["output"],
                   raw["spool"], (keep[0], tuple(keep[1])) if keep else None)


def decode_batches(batches: Iterator[pa.RecordBatch], plan: DecodePlan) -> Iterator[pa.RecordBatch]:
    """``plan`` applied to ``batches``: decoded records; dead letters in the same
    stream (tagged) or, for a detoured step, spooled once the input is consumed."""
    from ember.runner.spark.json_decode import decode_json

    schema = arrow_schema(plan.output_struct)
    spooled: list[tuple[pa.Array, list[str]]] = []
    for batch in batches:
        texts = batch.column(plan.field)
        decoded, good, reasons = decode_json(texts, plan.fields)
        if decoded.num_rows:
            columns = [batch.column(c) for c in plan.rest]
            if not good.all():
                keep = pa.array(good)
                columns = [c.filter(keep) for c in columns]
            columns += [decoded.column(i).combine_chunks() for i in range(decoded.num_columns)]
            if plan.keep is not None:  # the filter right after, pushed down (Spark applies it again)
                name, values = plan.keep
                column = columns[len(plan.rest) + [f[0] for f in plan.fields].index(name)]
                mask = pc.is_in(column, value_set=pa.array(values, pa.string()))
                columns = [c.filter(mask) for c in columns]
            if plan.spool is None:
                yield main_batch(columns, schema)
            else:
                yield pa.RecordBatch.from_arrays(columns, schema=schema)
        if reasons:
            index = sorted(reasons)
            raw = texts.take(pa.array(index))
            if not pa.types.is_string(raw.type):
                raw = pa.array([None if v is None else v.decode("utf-8", "replace") for v in raw.to_pylist()], pa.string())
            if plan.spool is None:
                yield dead_batch(schema, plan.tag, raw, [reasons[i] for i in index])
            else:
                spooled.append((raw, [reasons[i] for i in index]))
    if spooled:
        from ember.runner.spark.spool import write_dead_letters

        write_dead_letters(plan.spool, pa.concat_arrays([raw for raw, _ in spooled]),
                           [why for _, reasons in spooled for why in reasons])


@translates(ParseJsonNode)
def _parse_json(comp: Compilation, node: ParseJsonNode) -> Frame:
    from ember.runner.spark.translators.sources import decoded_source, decodes_at_source

    source = node.inputs[0]
    fusable = comp.config.fuse_sources and decodes_at_source(source) and _only_reader(comp, source, node)
    up = comp.frame(source) if not fusable else None
    types = ({f.name: f.dataType for f in up.df.schema.fields} if up is not None
             else {f.name: f.dataType for f in _parse_datatype_string(source.source.schema_ddl).fields})
    if node.field not in types:
        raise PipelineError(f"field '{node.field}' is not in the stream (fields: {', '.join(types)})", node.name)
    if not isinstance(types[node.field], T.StringType | T.BinaryType):
        raise PipelineError(f"field '{node.field}' holds {types[node.field].simpleString()}, not JSON text", node.name)
    rest = [T.StructField(name, kind, True) for name, kind in types.items() if name != node.field]
    clash = {f.name for f in rest} & {name for name, _, _ in node.fields}
    if clash:
        raise PipelineError(f"decoded field(s) {sorted(clash)} already exist in the stream; rename them first", node.name)
    spool = comp.detoured.get(id(node))
    if spool is None:
        require_reader(comp, node, node.dead_letter)
    decoded = [T.StructField(name, _parse_datatype_string(kind), True) for name, kind, _ in node.fields]  # kinds checked when declared
    main = T.StructType(rest + decoded)
    out = main if spool is not None else combined_struct(main, node.dead_letter.name)
    plan = DecodePlan(node.field, node.fields, tuple(f.name for f in rest), node.dead_letter.name, out.json(), spool)
    if fusable:  # decoded inside the source's reader: only the declared fields (of the records kept) cross into the JVM
        plan = replace(plan, keep=_pushed_filter(comp, node))
        return Frame(decoded_source(comp, source, plan), source.watermark)
    return Frame(up.df.mapInArrow(lambda batches: decode_batches(batches, plan), out), up.time)


def _pushed_filter(comp: Compilation, node: ParseJsonNode) -> tuple[str, tuple[str, ...]] | None:
    """``(field, values)`` when the only reader of ``node``'s records is a SQL filter
    ``field = 'value'`` or ``field IN ('a', 'b')`` on a decoded string field: the reader
    can drop the other records before they cross into the JVM."""
    readers = [n for n in comp.graph.nodes if any(i is node for i in n.inputs) and not isinstance(n, SideOutputNode)]
    if len(readers) != 1 or not isinstance(readers[0], FilterNode) or not isinstance(readers[0].predicate, str):
        return None
    try:
        expr = comp.spark._jsparkSession.sessionState().sqlParser().parseExpression(readers[0].predicate)
    except Exception:  # noqa: BLE001 - not pushed down; the filter's own translation reports errors
        return None
    kind = expr.getClass().getSimpleName()
    children = [expr.children().apply(i) for i in range(expr.children().size())]
    if kind == "EqualTo" and children[0].getClass().getSimpleName() == "Literal":
        children.reverse()
    if kind not in ("EqualTo", "In") or children[0].getClass().getSimpleName() != "UnresolvedAttribute":
        return None
    if children[0].nameParts().size() != 1:
        return None
    strings = {name.lower(): name for name, kind, _ in node.fields if kind == "string"}
    field = strings.get(children[0].name().lower())
    values = []
    for literal in children[1:]:
        if literal.getClass().getSimpleName() != "Literal" or literal.dataType().typeName() != "string" or literal.value() is None:
            return None
        values.append(literal.value().toString())
    return (field, tuple(values)) if field is not None and values else None


def _only_reader(comp: Compilation, source: Any, node: ParseJsonNode) -> bool:
    return all(n is node for n in comp.graph.nodes if any(i is source for i in n.inputs))


def lookup_with_unmatched(comp: Compilation, node: LookupJoinNode, stream: Any, table: Any) -> Any:
    """An inner lookup join whose records without a match become dead letters (tagged in
    the join's output, or spooled beside the query when they detour: spool.py)."""
    spool = comp.detoured.get(id(node))
    if spool is None:
        require_reader(comp, node, node.unmatched)
    marker = "__ember_matched"
    tag = node.unmatched.name
    joined = stream.join(F.broadcast(table.withColumn(marker, F.lit(True))), list(node.on), "left")
    missing = F.col(marker).isNull()
    error = unmatched_reason(node)
    main = [c for c in joined.columns if c != marker]
    tagged = joined.select(
        *main,
        F.when(missing, F.lit(tag)).alias(TAG),
        F.when(missing, F.to_json(F.struct(*[F.col(c) for c in stream.columns if c not in HIDDEN]))).alias(side_column(tag, "raw")),
        F.when(missing, error).alias(side_column(tag, "error")),
    )
    if spool is None:
        return tagged
    return spooled_letters(tagged, side_column(tag, "raw"), side_column(tag, "error"), spool, main)


def unmatched_reason(node: LookupJoinNode) -> Any:
    """A lookup join's dead letter's ``error``: which key matched no row of the table."""
    keys = ", ".join(node.on)
    return F.concat(F.lit(f"no match in the lookup table for {keys} = "), F.to_json(F.struct(*[F.col(k) for k in node.on])))


def spooled_letters(df: Any, raw: str, why: str, spool: str, main: list[str]) -> Any:
    """``df``'s rows whose column ``raw`` is null, with columns ``main``; the others'
    ``raw`` and ``why`` (a dead letter's record and reason) spooled beside the query
    (spool.py) once a task's input is consumed."""
    schema = df.select(*main).schema

    def spooled(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from ember.runner.spark.spool import write_dead_letters

        raws: list[str] = []
        errors: list[str] = []
        for batch in batches:
            dead = pc.is_valid(batch.column(raw))
            letters = batch.filter(dead)
            raws += letters.column(raw).to_pylist()
            errors += letters.column(why).to_pylist()
            yield batch.filter(pc.invert(dead)).select(main)
        if errors:
            write_dead_letters(spool, raws, errors)

    return df.mapInArrow(spooled, schema)
