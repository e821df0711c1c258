"""The vectorised keyed variant: one user call per state bucket and micro-batch.

The user's :class:`~ember.functions.VectorizedKeyedFunction` gets all of a
bucket's records of the batch as one pandas DataFrame (sorted by key, then
timestamp) and the current state of those keys as a DataFrame indexed by key
(columns = its ``state_schema``), and returns output rows and state updates.
The bucket's state table is held in Spark's state store like the per-record
runtime's (design A of docs/design/keyed-state.md): exactly-once, restored on
restart, never double-applied on a replayed batch.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from ember.errors import UserFunctionError
from ember.functions import BatchContext, VectorizedKeyedFunction, record_text
from ember.runner.spark.keyed.runtime import PRE, TAG, TIME_OUT, ember_watermark, side_column
from ember.runner.spark.narrowing import narrowed

__all__ = ["make_vectorized_bucket_function", "BlobTable", "DeltaTable"]


class _Context(BatchContext):
    def __init__(self, watermark: int | None, now: int) -> None:
        self.current_watermark, self.current_processing_time = watermark, now


def _index(pdf: pd.DataFrame, keys: list[str]) -> pd.Index:
    return pd.Index(pdf[keys[0]]) if len(keys) == 1 else pd.MultiIndex.from_frame(pdf[keys])


class BlobTable:
    """Design A: the bucket's whole table, one pickled DataFrame in Spark's ``GroupState``,
    rewritten whenever a batch changes it."""

    def __init__(self, state: Any, fields: list[str]) -> None:
        self.state = state
        self.stored: pd.DataFrame = pickle.loads(state.get[0]) if state.exists else pd.DataFrame(columns=fields)

    def current(self, keys: pd.Index) -> pd.DataFrame:
        return self.stored[self.stored.index.isin(keys)]

    def update(self, updates: pd.DataFrame) -> None:
        stored = self.stored
        kept = updates.dropna(how="all")  # an all-null row deletes the key's state
        stored = pd.concat([stored[~stored.index.isin(updates.index)], kept]) if len(stored) else kept
        self.stored = stored
        if len(stored):
            self.state.update((pickle.dumps(stored, protocol=pickle.HIGHEST_PROTOCOL),))
        elif self.state.exists:
            self.state.remove()


class DeltaTable:
    """Design B (keyed/delta.py): the bucket's table read and written per key, through a
    :class:`~ember.runner.spark.keyed.delta.DeltaLog` (only changed rows are checkpointed)."""

    def __init__(self, log: Any, key: str, fields: list[str], types: list[Any], step: str) -> None:
        self.log, self.key, self.fields, self.types, self.step = log, key, fields, types, step

    def current(self, keys: pd.Index) -> pd.DataFrame:
        found, columns = self.log.read(np.asarray(keys, dtype=np.int64))
        return pd.DataFrame(dict(zip(self.fields, columns)), index=pd.Index(found, name=self.key))

    def update(self, updates: pd.DataFrame) -> None:
        if updates.index.has_duplicates:
            updates = updates[~updates.index.duplicated(keep="last")]
        updates = updates.sort_index()
        deleted = updates.isna().all(axis=1).to_numpy()
        columns = []
        for field, kind in zip(self.fields, self.types):
            values = updates[field]
            nulls = values.isna().to_numpy() & ~deleted
            if nulls.any():
                raise UserFunctionError(
                    f"step '{self.step}': state field '{field}' is null for key {updates.index[nulls].tolist()[0]!r} without the "
                    "whole row being null (a deletion); state_layout='delta' stores state fields as numbers"
                )
            columns.append(values.where(~deleted, 0).to_numpy().astype(kind))
        try:
            keys = updates.index.to_numpy().astype(np.int64)
        except (TypeError, ValueError) as exc:
            raise UserFunctionError(f"step '{self.step}': state updates must be indexed by the integer key: {exc}") from exc
        self.log.write(keys, columns, deleted)


def make_vectorized_bucket_function(
    fn: VectorizedKeyedFunction,
    step: str,
    keys: list[str],
    fields: list[str],
    state_fields: list[str],
    out_fields: list[str],
    time_column: str | None,
    event_time: bool,
    dead_letter: str | None = None,
    emit_time: bool = False,
) -> Callable[[Any, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """The ``applyInPandasWithState`` function of one vectorised keyed step. With
    ``dead_letter`` (a tag), a failing call is narrowed down by keys (:func:`_by_keys`) and
    the output frames carry the combined columns (TAG and the tag's ``raw``/``error``).
    ``emit_time`` (another keyed step reads it with event time): each output row also carries
    its event time (TIME_OUT) and PRE (False): the latest event time among its key's records
    of the call when the row holds the key fields, else the call's latest (:func:`_stamped`)."""
    opened: dict[str, bool] = {}
    name = type(fn).__name__

    def call(pdf: pd.DataFrame, current: pd.DataFrame, ctx: _Context) -> tuple[Any, Any]:
        """``fn.process_batch`` and its result checked: (output rows or None, updates or None)."""
        try:
            result = fn.process_batch(pdf[fields], current, ctx)
        except UserFunctionError:
            raise
        except Exception as exc:
            raise UserFunctionError(f"step '{step}': {name}.process_batch raised {type(exc).__name__}: {exc}") from exc
        if not (isinstance(result, tuple) and len(result) == 2):
            raise UserFunctionError(
                f"step '{step}': {name}.process_batch must return (output DataFrame or None, "
                f"state updates DataFrame or None), got {type(result).__name__}"
            )
        out, updates = result
        if updates is not None and len(updates):
            missing = [c for c in state_fields if c not in updates.columns]
            if missing:
                raise UserFunctionError(f"step '{step}': state updates lack the state field(s) {missing}")
            updates = updates[state_fields]
        if out is not None and len(out):
            missing = [c for c in out_fields if c not in out.columns]
            if missing:
                raise UserFunctionError(f"step '{step}': the output lacks the field(s) {missing} of its output_schema")
            out = out[out_fields]
        return out, updates

    def run(bucket: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        if not opened:
            fn.open()
            opened["yes"] = True
        given = [f for f in frames if len(f)]
        if not given:
            return
        pdf = given[0] if len(given) == 1 else pd.concat(given, ignore_index=True)
        sort_by = [pdf[k].to_numpy() for k in reversed(keys)]
        if time_column is not None:
            sort_by.insert(0, pdf[time_column].to_numpy().astype("datetime64[ms]").astype(np.int64))
        pdf = pdf.iloc[np.lexsort(sort_by)].reset_index(drop=True)
        table = getattr(state, "table", None) or BlobTable(state, state_fields)
        batch_keys = _index(pdf, keys).unique()
        current = table.current(batch_keys)
        ctx = _Context(ember_watermark(state.getCurrentWatermarkMs()) if event_time else None, state.getCurrentProcessingTimeMs())
        raws: list[str] = []
        errors: list[str] = []
        if dead_letter is None:
            results = [call(pdf, current, ctx)]
        else:
            results, raws, errors = _by_keys(call, pdf, current, ctx, keys, [f for f in fields if f != time_column])
        changed = [u for _, u in results if u is not None and len(u)]
        if changed:
            table.update(changed[0] if len(changed) == 1 else pd.concat(changed))
        outs = [o for o, _ in results if o is not None and len(o)]
        if dead_letter is not None:
            extra = {TAG: None, side_column(dead_letter, "raw"): None, side_column(dead_letter, "error"): None}
            outs = [o.assign(**extra) for o in outs]
            if errors:
                dead = pd.DataFrame({f: [None] * len(errors) for f in out_fields})
                outs.append(dead.assign(**{TAG: dead_letter, side_column(dead_letter, "raw"): raws,
                                           side_column(dead_letter, "error"): errors}))
        if emit_time and outs:
            assert time_column is not None
            outs = _stamped(outs, pdf, keys, pdf[time_column].to_numpy().astype("datetime64[ms]").astype(np.int64))
        yield from outs

    return run


def _stamped(outs: list[pd.DataFrame], pdf: pd.DataFrame, keys: list[str], millis: np.ndarray) -> list[pd.DataFrame]:
    """``outs`` with each row's event time (TIME_OUT, epoch ms) and PRE (False) for the keyed
    step reading them: Flink stamps a process function's output with its input record's time;
    a batch of records has none, so a row gets the latest time of its key's records in the
    call (``pdf``, at ``millis``) when it holds the key fields — else the call's latest. Never
    behind the records it came from, never late for the watermark those records make."""
    latest = int(millis.max())
    by_key = pd.Series(millis, index=_index(pdf, keys)).groupby(level=list(range(len(keys)))).max()
    stamped = []
    for o in outs:
        t: Any = latest
        if all(k in o.columns for k in keys):
            index = _index(o.reset_index(drop=True), keys)
            t = by_key.reindex(index).fillna(latest).to_numpy().astype(np.int64)
        stamped.append(o.assign(**{TIME_OUT: t, PRE: False}))
    return stamped


def _by_keys(call: Callable[[pd.DataFrame, pd.DataFrame, Any], tuple[Any, Any]], pdf: pd.DataFrame,
             current: pd.DataFrame, ctx: Any, keys: list[str], visible: list[str]) -> tuple[list[Any], list[str], list[str]]:
    """``call`` over ``pdf`` (sorted by key) narrowed down by keys: the key groups split in
    halves, each called with its records and its keys' state, down to single keys. Returns the
    results of the calls that succeeded and, for each key its call fails on alone, a dead letter
    per record (``visible`` fields as JSON) with the call's error; such a key's state is
    untouched. Keys are independent, so any split gives each key the same result."""
    index = _index(pdf, keys)
    codes = pd.factorize(index)[0]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if len(codes) else np.array([], dtype=np.int64)
    bounds = np.r_[starts, len(pdf)]
    group_keys = index[starts]
    raws: list[str] = []
    errors: list[str] = []

    def part(lo: int, hi: int) -> tuple[Any, Any]:
        rows = pdf if (lo, hi) == (0, len(starts)) else pdf.iloc[bounds[lo]:bounds[hi]].reset_index(drop=True)
        return call(rows, current[current.index.isin(group_keys[lo:hi])], ctx)

    def failed(span: tuple[int, int], exc: Exception) -> None:
        lo, hi = span
        error = str(exc) if isinstance(exc, UserFunctionError) else f"{type(exc).__name__}: {exc}"
        for record in pdf.iloc[bounds[lo]:bounds[hi]][visible].to_dict("records"):
            raws.append(record_text(record))
            errors.append(error)

    results = narrowed(lambda span: part(*span), (0, len(starts)), lambda span: span[1] - span[0],
                       lambda span, a, b: (span[0] + a, span[0] + b), failed)
    return results, raws, errors
