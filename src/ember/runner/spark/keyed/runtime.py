"""The keyed-state runtime inside Spark's Python workers (design A of docs/design/keyed-state.md).

Records are grouped by a hash bucket of their key (``STATE_BUCKETS`` buckets,
fixed: the bucket is part of the checkpoint's state layout). Spark calls
:func:`make_bucket_function`'s function once per bucket and micro-batch with
all of that bucket's records; the bucket's keyed state is one pickled dict
``{key: {state name: value}}`` held in Spark's state store (RocksDB), so it is
checkpointed with the batch and restored on restart or replay. The user's
function is called once per record; the runtime adds no per-key or
per-record call of its own.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from ember.api.functions import Context, KeyedProcessFunction, RuntimeContext, ValueState
from ember.errors import UserFunctionError
from ember.state.descriptors import ValueStateDescriptor

__all__ = ["STATE_BUCKETS", "make_bucket_function"]

STATE_BUCKETS = 128
_ABSENT = object()


class _Value(ValueState):
    __slots__ = ("_rt", "_name", "_default")

    def __init__(self, rt: "_Runtime", name: str, default: Any) -> None:
        self._rt, self._name, self._default = rt, name, default

    def value(self) -> Any:
        return self._rt.current.get(self._name, self._default)

    def update(self, value: Any) -> None:
        self._rt.current[self._name] = value

    def clear(self) -> None:
        self._rt.current.pop(self._name, None)


class _Runtime(RuntimeContext, Context):
    """Both the open() context and the per-element context; state objects read ``current``."""

    def __init__(self) -> None:
        self.current: dict[str, Any] = {}
        self.current_key: Any = None
        self.timestamp: int | None = None
        self._names: set[str] = set()

    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        if not isinstance(descriptor, ValueStateDescriptor):
            raise UserFunctionError(f"get_state takes a ValueStateDescriptor, got {descriptor!r}")
        if descriptor.name in self._names:
            raise UserFunctionError(f"state '{descriptor.name}' is declared twice")
        self._names.add(descriptor.name)
        return _Value(self, descriptor.name, descriptor.default)


def make_bucket_function(
    fn: KeyedProcessFunction, step: str, keys: list[str], fields: list[str], out_fields: list[str], time_field: str | None
) -> Callable[[Any, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """The ``applyInPandasWithState`` function of one keyed process step."""
    holder: dict[str, Any] = {}

    def runtime() -> _Runtime:
        rt = holder.get("rt")
        if rt is None:  # once per deserialised function, i.e. per task
            rt = holder["rt"] = _Runtime()
            fn.open(rt)
        return rt

    def run(bucket: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        rt = runtime()
        table: dict[Any, dict[str, Any]] = pickle.loads(state.get[0]) if state.exists else {}
        out: list[Any] = []
        for pdf in frames:
            if time_field is not None:
                pdf = pdf.iloc[np.argsort(pdf[time_field].to_numpy(), kind="stable")]
            columns = [pdf[f].tolist() for f in fields]
            key_cols = [pdf[k].tolist() for k in keys]
            times = pdf[time_field].tolist() if time_field is not None else None
            single = len(keys) == 1
            for i, values in enumerate(zip(*columns)):
                record = dict(zip(fields, values))
                key = key_cols[0][i] if single else tuple(c[i] for c in key_cols)
                current = table.get(key)
                rt.current = current if current is not None else {}
                rt.current_key = key
                rt.timestamp = times[i] if times is not None else None
                try:
                    result = fn.process_element(record, rt)
                    if result is not None:
                        out.extend(result)
                except Exception as exc:
                    raise UserFunctionError(
                        f"step '{step}': {type(fn).__name__}.process_element raised {type(exc).__name__}: {exc} "
                        f"on record {record!r}"
                    ) from exc
                if rt.current:
                    table[key] = rt.current
                elif current is not None:
                    del table[key]
        state.update((pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL),))
        if out:
            first = out[0]
            if isinstance(first, dict):
                yield pd.DataFrame(out, columns=out_fields)
            else:
                yield pd.DataFrame([tuple(r) for r in out], columns=out_fields)

    return run
