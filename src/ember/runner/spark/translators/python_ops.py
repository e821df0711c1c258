"""Python steps: per-record map / flat_map / filter and vectorised map_batches.

All run inside Spark's Python workers on Arrow batches (``mapInArrow`` /
``mapInPandas``): one JVM<->Python exchange per batch, never per record. A
user function that raises fails the job with the step's name, the function
and the offending record in the message.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from ember.errors import PipelineError, UserFunctionError
from ember.functions import record_text
from ember.graph.nodes import FlatMapNode, MapBatchesNode, MapNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.deadletters import combined_struct, dead_batch, main_batch, require_reader
from ember.runner.spark.keyed.runtime import HIDDEN, TAG, side_column, without_hidden
from ember.runner.spark.narrowing import narrowed
from ember.runner.spark.pickling import ship_by_value
from ember.runner.spark.spool import write_dead_letters

__all__ = ["python_filter", "lane_map", "output_struct", "arrow_schema", "build_batch", "records_out",
           "user_function_failed", "pair_records"]


def output_struct(schema: Any, fallback: Any, step: str) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    if schema is None:
        return fallback
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        try:
            parsed = _parse_datatype_string(schema)
        except Exception as exc:
            raise PipelineError(f"output_schema {schema!r} is not a valid Spark DDL schema: {exc}", step) from exc
        if isinstance(parsed, StructType):
            return parsed
    raise PipelineError(f"output_schema must be a Spark DDL string or StructType, got {schema!r}", step)


def arrow_schema(struct: Any) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Arrow timestamps need a zone: Spark reads them as instants (microseconds since the epoch), whatever it is.
    return to_arrow_schema(struct, timezone="UTC")


def _fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


def user_function_failed(step: str, fn: Callable[..., Any], record: Any, exc: BaseException) -> UserFunctionError:
    return UserFunctionError(
        f"step '{step}': {_fn_name(fn)} raised {type(exc).__name__}: {exc} on record {record!r}"
    )


def _to_row(value: Any, names: list[str], step: str, fn: Callable[..., Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, tuple) and len(value) == len(names):
        return dict(zip(names, value))
    if hasattr(value, "asDict"):
        return value.asDict()
    if len(names) == 1 and not isinstance(value, (tuple, list)):
        return {names[0]: value}
    raise UserFunctionError(
        f"step '{step}': {_fn_name(fn)} returned {value!r}; expected a dict or a tuple of fields {names}"
    )


def records_out(result: Any, names: list[str], step: str, fn: Callable[..., Any]) -> list[dict[str, Any]]:
    """What a function returned for one input, as output rows: None (nothing), one record
    (a dict, or a tuple of the output's fields), or an iterable of records."""
    if result is None:
        return []
    if isinstance(result, dict | tuple) or hasattr(result, "asDict"):
        return [_to_row(result, names, step, fn)]
    try:
        values = list(result)
    except TypeError:
        return [_to_row(result, names, step, fn)]
    return [_to_row(v, names, step, fn) for v in values]


class PairFailed(UserFunctionError):
    """A join function failed on a pair: the message names the pair, ``reason`` does not (a
    dead letter carries the pair itself: keyed/pairs.py)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def pair_records(fn: Callable[[Any, Any], Any], names: list[str], step: str) -> Callable[[Any, Any], list[dict[str, Any]]]:
    """A join's ``fn(left, right)`` as a function of one pair returning its output rows; a
    failure of ``fn`` (or rows that do not fit the schema) names the step, the function and the pair."""

    def call(left: Any, right: Any) -> list[dict[str, Any]]:
        try:
            return records_out(fn(left, right), names, step, fn)
        except Exception as exc:
            reason = _reason(step, fn, exc)
            raise PairFailed(f"{reason} on record {(left, right)!r}", reason) from exc

    return call


def build_batch(rows: list[dict[str, Any]], schema: pa.Schema, step: str) -> pa.RecordBatch:
    try:
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise UserFunctionError(f"step '{step}': output does not match the output schema {schema}: {exc}") from exc


def _outputs(fn: Callable[..., Any], record: dict[str, Any], many: bool, names: list[str], step: str) -> list[dict[str, Any]]:
    """What a map (one record) or flat_map (an iterable, or None) returned for ``record``, as
    output rows; a failure names the step, the function and the record."""
    try:
        values: Iterable[Any] = (fn(record) or ()) if many else (fn(record),)
        return [_to_row(v, names, step, fn) for v in values]
    except UserFunctionError:
        raise
    except Exception as exc:
        raise user_function_failed(step, fn, record, exc) from exc


def _per_record(comp: Compilation, node: MapNode | FlatMapNode, many: bool) -> Frame:
    """``map`` (one output per record) and ``flat_map`` (an iterable per record)."""
    from pyspark.sql import types as T

    up = comp.frame(node.inputs[0])
    carried = [f for f in up.df.schema.fields if f.name in HIDDEN]  # between two keyed steps: each row's event time
    fields = without_hidden(up.df.schema)
    visible = fields.names
    out = output_struct(node.output_schema, fields, node.name)
    names, fn, step = out.names, node.fn, node.name
    if carried:  # every output row carries its input record's event time (Flink: a map keeps the timestamp)
        out = T.StructType(list(out.fields) + carried)
    schema = arrow_schema(out)
    ship_by_value(fn)
    if node.dead_letter is None:
        hidden = [f.name for f in carried]

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                rows = []
                times = batch.select(hidden).to_pylist() if hidden else None
                for i, record in enumerate(batch.select(visible).to_pylist() if hidden else batch.to_pylist()):
                    out_rows = _outputs(fn, record, many, names, step)
                    rows.extend(out_rows if times is None else ({**r, **times[i]} for r in out_rows))
                yield build_batch(rows, schema, step)

        return Frame(up.df.mapInArrow(run, out), up.time)
    spool = comp.detoured.get(id(node))  # the dead letters leave the query beside it (spool.py)
    if carried and spool is None:  # (a dead letter read beside a keyed step after this one detours)
        raise PipelineError(
            f"'{step}' sends dead letters between two stateful steps; that is not supported yet: move the step "
            "before the first stateful step or into its function", step
        )
    if spool is None:
        require_reader(comp, node, node.dead_letter)
    tag = node.dead_letter.name
    combined = out if spool is not None else combined_struct(out, tag)
    full = arrow_schema(combined)
    hidden = [f.name for f in carried]

    def run_with_dead_letters(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        letters = _DeadLetters(spool, full, tag)
        for batch in batches:
            produced: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
            raws, errors = [], []
            times = batch.select(hidden).to_pylist() if hidden else None
            for i, record in enumerate(batch.select(visible).to_pylist() if hidden else batch.to_pylist()):
                try:
                    values: Iterable[Any] = (fn(record) or ()) if many else (fn(record),)
                    out_rows = [_to_row(v, names, step, fn) for v in values]
                    produced.append((record, out_rows if times is None else [{**r, **times[i]} for r in out_rows]))
                except Exception as exc:  # noqa: BLE001 - the record becomes a dead letter
                    raws.append(record_text(record))
                    errors.append(_reason(step, fn, exc))
            yield from letters.emit(_fitting(produced, schema, step, fn, raws, errors), raws, errors)
        letters.close()

    return Frame(up.df.mapInArrow(run_with_dead_letters, combined), up.time)


class _DeadLetters:
    """A task's dead letters: in its output stream, tagged beside the main rows (``full``: the
    combined schema), or spooled beside the query when they detour (``spool``: written once
    the task's input is consumed, spool.py)."""

    def __init__(self, spool: str | None, full: pa.Schema, tag: str) -> None:
        self.spool, self.full, self.tag = spool, full, tag
        self.raws: list[str] = []
        self.errors: list[str] = []

    def emit(self, main: pa.RecordBatch, raws: list[str], errors: list[str]) -> Iterator[pa.RecordBatch]:
        """A batch's main rows and its dead letters (``raws``, ``errors``)."""
        if self.spool is not None:
            self.raws += raws
            self.errors += errors
            yield main
            return
        yield main_batch(main.columns, self.full)
        if errors:
            yield dead_batch(self.full, self.tag, raws, errors)

    def close(self) -> None:
        if self.spool is not None and self.errors:
            write_dead_letters(self.spool, self.raws, self.errors)


def _reason(step: str, fn: Callable[..., Any], exc: BaseException) -> str:
    if isinstance(exc, UserFunctionError):
        return str(exc)
    return f"step '{step}': {_fn_name(fn)} raised {type(exc).__name__}: {exc}"


@translates(MapNode)
def _map(comp: Compilation, node: MapNode) -> Frame:
    return _per_record(comp, node, many=False)


@translates(FlatMapNode)
def _flat_map(comp: Compilation, node: FlatMapNode) -> Frame:
    return _per_record(comp, node, many=True)


def python_filter(comp: Compilation, df: Any, node: Any, lanes: tuple[str, list[int], list[str]] | None = None,
                  spool: str | None = None) -> Any:
    """``node``'s Python predicate on ``df``'s rows. ``lanes``: ``(lane column, lanes, fields)``
    — only the rows of those lanes of a fan-out (translators/fanout.py) are tested, on
    ``fields``; the others pass; a record the predicate raises on then goes to ``spool``
    (the step's dead letters, which detour there) when given, else fails the job."""
    fn, step, tag = node.predicate, node.name, node.dead_letter
    ship_by_value(fn)
    if lanes is not None:
        column, tested, visible = lanes[0], set(lanes[1]), lanes[2]

        def run_on_lanes(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            raws: list[str] = []
            errors: list[str] = []
            for batch in batches:
                keep = []
                which = batch.column(column).to_pylist()
                for i, record in enumerate(batch.select(visible).to_pylist()):
                    if which[i] not in tested:
                        keep.append(True)
                        continue
                    try:
                        keep.append(bool(fn(record)))
                    except Exception as exc:
                        if spool is None:
                            raise user_function_failed(step, fn, record, exc) from exc
                        keep.append(False)
                        raws.append(record_text(record))
                        errors.append(_reason(step, fn, exc))
                yield batch.filter(pa.array(keep, type=pa.bool_()))
            if spool is not None and errors:  # the task's dead letters, once its input is consumed
                write_dead_letters(spool, raws, errors)

        return df.mapInArrow(run_on_lanes, df.schema)
    if tag is None:

        visible = without_hidden(df.schema).names  # never a row's hidden columns

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                keep = []
                for record in batch.select(visible).to_pylist():
                    try:
                        keep.append(bool(fn(record)))
                    except Exception as exc:
                        raise user_function_failed(step, fn, record, exc) from exc
                yield batch.filter(pa.array(keep, type=pa.bool_()))

        return df.mapInArrow(run, df.schema)

    spool = comp.detoured.get(id(node))  # the dead letters leave the query beside it (spool.py)
    if spool is None:
        require_reader(comp, node, tag)
    combined = df.schema if spool is not None else combined_struct(df.schema, tag.name)
    full = arrow_schema(combined)
    visible = without_hidden(df.schema).names  # a record without the columns carried between keyed steps

    def run_with_dead_letters(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        letters = _DeadLetters(spool, full, tag.name)
        for batch in batches:
            keep, raws, errors = [], [], []
            for record in batch.select(visible).to_pylist():
                try:
                    keep.append(bool(fn(record)))
                except Exception as exc:  # noqa: BLE001 - the record becomes a dead letter
                    keep.append(False)
                    raws.append(record_text(record))
                    errors.append(_reason(step, fn, exc))
            yield from letters.emit(batch.filter(pa.array(keep, type=pa.bool_())), raws, errors)
        letters.close()

    return df.mapInArrow(run_with_dead_letters, combined)


def lane_map(df: Any, node: MapNode | FlatMapNode, lane: tuple[str, int, list[str]], prefix: str,
             spool: str | None = None) -> tuple[Any, list[str]]:
    """``node`` (a map or flat_map) on the rows of one lane of a fan-out only
    (translators/fanout.py). ``lane``: ``(lane column, the lane, the records' fields)``. Each
    output record becomes a row with its input row's columns (its event time among them:
    Flink's map keeps the timestamp) and the record's fields in columns ``prefix + field``;
    other lanes' rows pass with those columns null. A record the function raises on, or whose
    output does not fit the output schema, goes to ``spool`` (the step's dead letters, which
    detour there) when given, else fails the job. Returns the frame and the output's fields."""
    from pyspark.sql import types as T

    column, lane_id, visible = lane
    out = output_struct(node.output_schema, T.StructType([df.schema[f] for f in visible]), node.name)
    extra = [T.StructField(prefix + f.name, f.dataType, True) for f in out.fields]
    full = T.StructType(list(df.schema.fields) + extra)
    schema = arrow_schema(full)
    names, fn, step, many = out.names, node.fn, node.name, isinstance(node, FlatMapNode)
    added = schema.names[len(df.schema.fields):]
    ship_by_value(fn)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        raws: list[str] = []
        errors: list[str] = []
        for batch in batches:
            mine = pc.equal(batch.column(column), lane_id)
            yield from _other_lanes(batch, mine, schema, added)
            produced: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
            for row in batch.filter(mine).to_pylist():
                record = {f: row[f] for f in visible}
                if spool is None:
                    outputs = _outputs(fn, record, many, names, step)
                else:
                    try:
                        values: Iterable[Any] = (fn(record) or ()) if many else (fn(record),)
                        outputs = [_to_row(v, names, step, fn) for v in values]
                    except Exception as exc:  # noqa: BLE001 - the record becomes a dead letter
                        raws.append(record_text(record))
                        errors.append(_reason(step, fn, exc))
                        continue
                produced.append((record, [{**row, **{prefix + k: v for k, v in o.items()}} for o in outputs]))
            if spool is None:
                rows = [r for _, out_rows in produced for r in out_rows]
                if rows:
                    yield build_batch(rows, schema, step)
                continue
            built = _fitting(produced, schema, step, fn, raws, errors)
            if built.num_rows:
                yield built
        if spool is not None and errors:  # the task's dead letters, once its input is consumed
            write_dead_letters(spool, raws, errors)

    return df.mapInArrow(run, full), names


def _other_lanes(batch: pa.RecordBatch, mine: Any, schema: pa.Schema, added: list[str]) -> Iterator[pa.RecordBatch]:
    """The rows of ``batch`` that are not the lane's (``mine``: a mask of its rows), as rows of
    ``schema``, the lane step's ``added`` columns null (none when every row is the lane's)."""
    import pyarrow.compute as pc

    others = batch.filter(pc.invert(mine))
    if others.num_rows:
        nulls = [pa.nulls(others.num_rows, type=schema.field(c).type) for c in added]
        yield pa.RecordBatch.from_arrays(list(others.columns) + nulls, schema=schema)


def lane_map_batches(df: Any, node: MapBatchesNode, lane: tuple[str, int, list[str]], prefix: str,
                     spool: str | None = None) -> tuple[Any, list[str]]:
    """``node`` (a ``map_batches``) on the rows of one lane of a fan-out only
    (translators/fanout.py), as :func:`lane_map` does a map: ``fn`` gets the lane's records of
    each Arrow batch (a pandas DataFrame or a pyarrow RecordBatch, per ``batch_format``) and must
    return one row per record, in order — row i goes beside record i's row, keeping its event
    time (the rule of ``map_batches`` between two keyed steps). Its fields go to columns
    ``prefix + field``; other lanes' rows pass with those columns null. With ``spool`` (the
    step's dead letters detour there) a failing call is narrowed down to the records that fail
    alone (:func:`narrowed`), which become dead letters; else a failure fails the job, naming
    the step. Returns the frame and the output's fields."""
    from pyspark.sql import types as T

    column, lane_id, visible = lane
    out = output_struct(node.output_schema, T.StructType([df.schema[f] for f in visible]), node.name)
    full = T.StructType(list(df.schema.fields) + [T.StructField(prefix + f.name, f.dataType, True) for f in out.fields])
    schema, results = arrow_schema(full), arrow_schema(out)
    added = schema.names[len(df.schema.fields):]
    fn, step, pandas = node.fn, node.name, node.batch_format == "pandas"
    ship_by_value(fn)

    def called(rows: pa.RecordBatch) -> pa.RecordBatch:
        """Record batch ``rows`` (the lane's rows, every column) with ``fn``'s fields beside."""
        records = rows.select(visible)
        try:
            result = fn(records.to_pandas() if pandas else records)
        except Exception as exc:
            raise UserFunctionError(f"step '{step}': {_fn_name(fn)} raised {type(exc).__name__}: {exc}") from exc
        try:
            if pandas:
                table = pa.Table.from_pandas(result, preserve_index=False)
            else:
                table = pa.Table.from_batches([result]) if isinstance(result, pa.RecordBatch) else result
            if not isinstance(table, pa.Table):
                raise TypeError(f"it returned a {type(result).__name__}")
            table = table.select(results.names).cast(results)
        except (KeyError, TypeError, AttributeError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            what = "pandas DataFrame" if pandas else "pyarrow RecordBatch or Table"
            raise UserFunctionError(f"step '{step}': {_fn_name(fn)} must return a {what} of the output schema "
                                    f"{results}: {exc}") from exc
        if table.num_rows != rows.num_rows:
            raise UserFunctionError(
                f"step '{step}': on a lane of a fan-out {_fn_name(fn)} must return one row per input row, in order "
                f"(row i keeps record i's event time); it returned {table.num_rows} rows for {rows.num_rows}")
        columns = [table.column(n).combine_chunks() for n in results.names]
        return pa.RecordBatch.from_arrays(list(rows.columns) + columns, schema=schema)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc

        raws: list[str] = []
        errors: list[str] = []

        def failed(one: pa.RecordBatch, exc: Exception) -> None:
            raws.append(record_text(one.select(visible).to_pylist()[0]))
            errors.append(_reason(step, fn, exc))

        for batch in batches:
            mine = pc.equal(batch.column(column), lane_id)
            yield from _other_lanes(batch, mine, schema, added)
            own = batch.filter(mine)
            if own.num_rows:
                yield from ([called(own)] if spool is None else
                            narrowed(called, own, lambda b: b.num_rows, lambda b, a, z: b.slice(a, z - a), failed))
        if spool is not None and errors:
            write_dead_letters(spool, raws, errors)

    return df.mapInArrow(run, full), out.names


def _fitting(produced: list[tuple[dict[str, Any], list[dict[str, Any]]]], schema: pa.Schema, step: str,
             fn: Callable[..., Any], raws: list[str], errors: list[str]) -> pa.RecordBatch:
    """The rows of ``produced`` (each input record with its output rows) as one batch of
    ``schema``; a record whose output rows do not fit it becomes a dead letter (added to
    ``raws`` and ``errors``) instead."""
    rows = [r for _, out_rows in produced for r in out_rows]
    try:
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):  # find the records whose output does not fit
        rows = []
        for record, out_rows in produced:
            try:
                pa.RecordBatch.from_pylist(out_rows, schema=schema)
                rows.extend(out_rows)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
                raws.append(record_text(record))
                errors.append(f"step '{step}': {_fn_name(fn)} returned {out_rows!r}, which does not fit "
                              f"the output schema: {exc}")
        return pa.RecordBatch.from_pylist(rows, schema=schema)


@translates(MapBatchesNode)
def _map_batches(comp: Compilation, node: MapBatchesNode) -> Frame:
    up = comp.frame(node.inputs[0])
    if any(f.name in HIDDEN for f in up.df.schema.fields):
        return _map_batches_carrying_time(comp, up, node)
    out = output_struct(node.output_schema, up.df.schema, node.name)
    fn, step = node.fn, node.name
    ship_by_value(fn)
    schema = arrow_schema(out)

    def conformed(result: Any) -> list[pa.RecordBatch]:
        if isinstance(result, pa.Table):
            return result.cast(schema).to_batches()
        if isinstance(result, pa.RecordBatch) and result.schema.equals(schema):
            return [result]
        if isinstance(result, pa.RecordBatch):
            return pa.Table.from_batches([result]).cast(schema).to_batches()
        raise UserFunctionError(
            f"step '{step}': {_fn_name(fn)} must return a pyarrow RecordBatch or Table, got {type(result).__name__}"
        )

    if node.dead_letter is not None:
        return _map_batches_with_dead_letters(comp, node, up, out, conformed)
    if node.batch_format == "pandas":

        def run_pandas(frames: Iterator[Any]) -> Iterator[Any]:
            for pdf in frames:
                try:
                    yield fn(pdf)
                except Exception as exc:
                    raise UserFunctionError(f"step '{step}': {_fn_name(fn)} raised {type(exc).__name__}: {exc}") from exc

        return Frame(up.df.mapInPandas(run_pandas, out), up.time)

    def run_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            try:
                result = fn(batch)
            except Exception as exc:
                raise UserFunctionError(f"step '{step}': {_fn_name(fn)} raised {type(exc).__name__}: {exc}") from exc
            yield from conformed(result)

    return Frame(up.df.mapInArrow(run_arrow, out), up.time)


def _map_batches_carrying_time(comp: Compilation, up: Frame, node: MapBatchesNode) -> Frame:
    """``map_batches`` between two keyed steps: ``fn`` sees the records' fields only and must
    return one row per input row, in order — row i keeps record i's event time (the hidden
    columns: Flink's map keeps a record's timestamp). Another number of rows fails the job,
    naming the step: which output row came from which record could only be guessed.

    With dead letters, a batch whose call fails (it raised, returned another number of rows,
    or rows that do not fit the schema) is narrowed down to the records that fail alone
    (:func:`narrowed`); the others' rows go on, each with its record's event time. The dead
    letters leave the query beside it (spooled, as a ``map``'s there): read beside a keyed
    step after this one they would need event time of their own — refused."""
    from pyspark.sql import types as T

    carried = [f for f in up.df.schema.fields if f.name in HIDDEN]
    fields = without_hidden(up.df.schema)
    visible, hidden = fields.names, [f.name for f in carried]
    out = output_struct(node.output_schema, fields, node.name)
    full = T.StructType(list(out.fields) + carried)
    fn, step = node.fn, node.name
    spool = None
    if node.dead_letter is not None:
        spool = comp.detoured.get(id(node))
        if spool is None:
            raise PipelineError(
                f"'{step}': map_batches with dead letters between two stateful steps, its dead letters read beside a "
                "stateful step after it, is not supported yet: read them with a sink of their own "
                "(get_side_output(tag).sink_to(...)), or move the step before the first stateful step", step)
    ship_by_value(fn)

    def called(records: Any, rows: int, kind: type, what: str) -> Any:
        try:
            result = fn(records)
        except Exception as exc:
            raise UserFunctionError(f"step '{step}': {_fn_name(fn)} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(result, pa.RecordBatch):
            result = pa.Table.from_batches([result])
        if not isinstance(result, kind):
            raise UserFunctionError(f"step '{step}': {_fn_name(fn)} must return a {what}, got {type(result).__name__}")
        if len(result) != rows:
            raise UserFunctionError(
                f"step '{step}': between two stateful steps {_fn_name(fn)} must return one row per input row, in "
                f"order (row i keeps record i's event time); it returned {len(result)} rows for {rows}")
        return result

    def each(call: Callable[[Any], Any], part: Any, size: Callable[[Any], int], cut: Callable[[Any, int, int], Any],
             record: Callable[[Any], dict[str, Any]], letters: list[list[str]]) -> list[Any]:
        """``[call(part)]``, or with dead letters the results of the parts that do not fail
        (``letters``: the task's dead letters so far, raw records and reasons)."""
        if spool is None:
            return [call(part)]

        def failed(one: Any, exc: Exception) -> None:
            letters[0].append(record_text(record(one)))
            letters[1].append(_reason(step, fn, exc))

        return narrowed(call, part, size, cut, failed)

    def spill(letters: list[list[str]]) -> None:
        if spool is not None and letters[1]:
            write_dead_letters(spool, letters[0], letters[1])

    if node.batch_format == "pandas":
        import pandas as pd

        def one_frame(pdf: Any) -> Any:
            result = called(pdf[visible], len(pdf), pd.DataFrame, "pandas DataFrame").reset_index(drop=True)
            return result.assign(**{name: pdf[name].to_numpy() for name in hidden})

        def run_pandas(frames: Iterator[Any]) -> Iterator[Any]:
            letters: list[list[str]] = [[], []]
            for pdf in frames:
                yield from each(one_frame, pdf, len, lambda p, a, b: p.iloc[a:b].reset_index(drop=True),
                                lambda p: p[visible].to_dict("records")[0], letters)
            spill(letters)

        return Frame(up.df.mapInPandas(run_pandas, full), up.time)
    schema = arrow_schema(out)

    def one_batch(batch: pa.RecordBatch) -> pa.Table:
        result = called(batch.select(visible), batch.num_rows, pa.Table, "pyarrow RecordBatch or Table")
        try:
            result = result.select(out.names).cast(schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise UserFunctionError(f"step '{step}': {_fn_name(fn)}'s result does not fit the output schema: {exc}") from exc
        for name in hidden:
            result = result.append_column(name, pa.chunked_array([batch.column(name)]))
        return result

    def run_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        letters: list[list[str]] = [[], []]
        for batch in batches:
            for result in each(one_batch, batch, lambda b: b.num_rows, lambda b, a, z: b.slice(a, z - a),
                               lambda b: b.select(visible).to_pylist()[0], letters):
                yield from result.to_batches()
        spill(letters)

    return Frame(up.df.mapInArrow(run_arrow, full), up.time)


def _map_batches_with_dead_letters(comp: Compilation, node: MapBatchesNode, up: Frame, out: Any,
                                   conformed: Callable[[Any], list[pa.RecordBatch]]) -> Frame:
    """``map_batches`` whose failing batches are narrowed down to their bad records
    (:func:`narrowed`): those become dead letters, in the step's output (tagged) or spooled
    beside the query when they detour (as ``map``'s)."""
    fn, step = node.fn, node.name
    spool = comp.detoured.get(id(node))
    if spool is None:
        require_reader(comp, node, node.dead_letter)
    tag = node.dead_letter.name
    combined = out if spool is not None else combined_struct(out, tag)
    full = arrow_schema(combined)
    names = out.names

    def reason(exc: Exception) -> str:
        return _reason(step, fn, exc)

    if node.batch_format == "pandas":  # Spark converts the frames both ways, as without dead letters

        def run_pandas(frames: Iterator[Any]) -> Iterator[Any]:
            import pandas as pd

            raws: list[str] = []
            errors: list[str] = []

            def failed(record: Any, exc: Exception) -> None:
                raws.append(record_text(record.to_dict("records")[0]))
                errors.append(reason(exc))

            for pdf in frames:
                before = len(errors)
                results = narrowed(fn, pdf, len, lambda p, a, b: p.iloc[a:b].reset_index(drop=True), failed)
                main = pd.concat(results, ignore_index=True) if len(results) > 1 else (
                    results[0] if results else pd.DataFrame({n: pd.Series(dtype=object) for n in names}))
                if spool is not None:
                    yield main
                    continue
                extra = {TAG: None, side_column(tag, "raw"): None, side_column(tag, "error"): None}
                yield main.assign(**extra)
                if len(errors) > before:
                    dead = pd.DataFrame({n: [None] * (len(errors) - before) for n in names})
                    yield dead.assign(**{TAG: tag, side_column(tag, "raw"): raws[before:],
                                         side_column(tag, "error"): errors[before:]})
            if spool is not None and errors:
                write_dead_letters(spool, raws, errors)

        return Frame(up.df.mapInPandas(run_pandas, combined), up.time)

    schema = arrow_schema(out)

    def run_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        letters = _DeadLetters(spool, full, tag)
        raws: list[str] = []
        errors: list[str] = []

        def failed(record: pa.RecordBatch, exc: Exception) -> None:
            raws.append(record_text(record.to_pylist()[0]))
            errors.append(reason(exc))

        for batch in batches:
            before = len(errors)
            parts = narrowed(lambda b: conformed(fn(b)), batch, lambda b: b.num_rows,
                             lambda b, a, z: b.slice(a, z - a), failed)
            built = [b for bs in parts for b in bs]
            main = pa.Table.from_batches(built, schema=schema).combine_chunks().to_batches() if built else []
            yield from letters.emit(main[0] if main else pa.RecordBatch.from_pylist([], schema=schema),
                                    raws[before:], errors[before:])
        letters.close()

    return Frame(up.df.mapInArrow(run_arrow, combined), up.time)
