"""Keyed process steps chained into one (Flink's operator chaining).

``s.key_by("a").process(f, ...).reinterpret_as_keyed("a").process(g, ...)`` promises that
``f`` emits every record under the key it was called with, so ``g`` may run on the same
key, in the same call, without a shuffle: :class:`ChainedFunction` is one
:class:`~ember.functions.KeyedProcessFunction` that runs ``f`` and hands each record ``f``
emits straight to ``g`` (ember.graph.chaining decides where; docs/design/dataflow.md).

Each step keeps its own state and timers on the shared key:

- state: a step's descriptors are renamed ``"<step>/<state>"``, so two steps may both
  declare ``"state"``;
- timers: the runtime keeps one timer per key and time; the chain notes which steps set it
  (a reserved slot entry per time domain, as the window operator does for its windows) and
  calls each of those steps' ``on_timer``, its output flowing on through the steps after it;
- side outputs: each step's own (the pipeline reads them from the chained step: no two
  steps of a chain have one of the same name, ember.graph.chaining);
- dead letters: a step's ``dead_letter`` takes the records *it* raises on (the record as it
  saw it) and, for a step after the first, the records the step before emitted under another
  key; a step without one fails the job when it raises, naming the step, as unchained.

A chain may end in a keyed window: the runner binds Ember's window operator as its last
function (``bound(..., last=)``), fed record by record like any step.

The chain runs on Ember's keyed runtime (runner/spark/keyed/bucket.py): it reads the key's
slot (``ctx.current``) for its timer notes and writes dead letters through the runtime's
``dead_letter``; it guards its own calls (``guards_itself``).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable, Iterable

from ember.errors import UserFunctionError
from ember.functions import KeyedProcessFunction, record_text
from ember.state.descriptors import StateDescriptor

__all__ = ["ChainLink", "ChainedFunction", "CHAIN_EVENT_TIMERS", "CHAIN_PROCESSING_TIMERS", "state_name"]

# A key's slot entries: timestamp -> the indexes of the chained steps whose timer it is.
CHAIN_EVENT_TIMERS, CHAIN_PROCESSING_TIMERS = "\x00chain_event", "\x00chain_proc"


def state_name(step: str, name: str) -> str:
    """The name a chained step's state ``name`` is kept under."""
    return f"{step}/{name}"


@dataclasses.dataclass
class ChainLink:
    """One step of a chain: its name, function, key fields, the field names of its output
    records (None for the last step: its rows leave the chain as they are), its dead-letter
    output's name (None: none) and the names of its side outputs the pipeline reads."""

    step: str
    fn: KeyedProcessFunction | None  # None: a window step's, until the runner binds its operator
    keys: tuple[str, ...]
    out_fields: list[str] | None = None
    dead_letter: str | None = None
    side_tags: frozenset[str] = frozenset()


class _StepContext:
    """What one chained step sees as its context: the runtime's, with its state under its
    own names, its timers noted as its own, and its own side outputs only."""

    def __init__(self, rt: Any, index: int, link: ChainLink) -> None:
        self._rt, self._index, self._link = rt, index, link

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rt, name)

    def get_state(self, descriptor: StateDescriptor) -> Any:
        return self._rt.get_state(dataclasses.replace(descriptor, name=state_name(self._link.step, descriptor.name)))

    def output(self, tag: Any, record: Any) -> None:
        if getattr(tag, "name", None) in self._link.side_tags or not hasattr(tag, "name"):
            self._rt.output(tag, record)  # (which refuses what is not an OutputTag)

    def _note(self, kind: str, timestamp: int) -> None:
        self._rt.current.setdefault(kind, {}).setdefault(int(timestamp), set()).add(self._index)

    def _forget(self, kind: str, timestamp: int, delete: Callable[[int], None]) -> None:
        notes = self._rt.current.get(kind)
        owners = notes.get(int(timestamp)) if notes else None
        if owners is None or self._index not in owners:
            return
        owners.discard(self._index)
        if not owners:
            del notes[int(timestamp)]
            delete(timestamp)  # no other step waits for it
            if not notes:
                del self._rt.current[kind]

    def register_event_time_timer(self, timestamp: int) -> None:
        self._rt.register_event_time_timer(timestamp)  # refuses first without event time
        self._note(CHAIN_EVENT_TIMERS, timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._rt.register_processing_time_timer(timestamp)
        self._note(CHAIN_PROCESSING_TIMERS, timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._forget(CHAIN_EVENT_TIMERS, timestamp, self._rt.delete_event_time_timer)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._forget(CHAIN_PROCESSING_TIMERS, timestamp, self._rt.delete_processing_time_timer)


class ChainedFunction(KeyedProcessFunction):
    """Several keyed process functions on one key, run in turn (see the module doc)."""

    guards_itself = True  # the keyed runtime leaves errors and dead letters to process_element/on_timer here

    def __init__(self, links: list[ChainLink]) -> None:
        if len(links) < 2:
            raise ValueError("a chain needs at least two steps")
        self.links = links
        self._contexts: list[Any] = []  # per step, its _StepContext (the context the step is given)
        self._rt: Any = None

    def bound(self, fields: list[list[str]], dead_letters: list[str | None],
              last: KeyedProcessFunction | None = None) -> "ChainedFunction":
        """A copy knowing each step's output field names but the last's (the runner reads
        them from the steps' output schemas), each step's dead-letter output (None: it has
        none; its failures fail the job) and, for a chain ending in a window, the window's
        operator (``last``)."""
        outs: list[list[str] | None] = [list(f) for f in fields] + [None]
        links = [dataclasses.replace(link, out_fields=f, dead_letter=d) for link, f, d in zip(self.links, outs, dead_letters)]
        if last is not None:
            links[-1] = dataclasses.replace(links[-1], fn=last)
        return ChainedFunction(links)

    def __getstate__(self) -> dict[str, Any]:
        return {"links": self.links, "_contexts": [], "_rt": None}  # a task builds its own stages

    @property
    def user_name(self) -> str:
        return " -> ".join(type(link.fn).__name__ if link.fn is not None else "window" for link in self.links)

    def failed_call(self, value: Any) -> tuple[str, Any, bool]:
        return f"{type(self.links[0].fn).__name__}.process_element", value, True

    def open(self, ctx: Any) -> None:
        self._rt = ctx
        self.__dict__.pop("_built", None)  # stages bind the contexts made here
        self._contexts = [_StepContext(ctx, i, link) for i, link in enumerate(self.links)]
        for link, step_ctx in zip(self.links, self._contexts):
            if link.fn is None:
                continue  # a window's operator, not bound yet (the restart check reads what open declares)
            try:
                link.fn.open(step_ctx)
            except UserFunctionError:
                raise
            except Exception as exc:
                raise UserFunctionError(
                    f"step '{link.step}': {type(link.fn).__name__}.open raised {type(exc).__name__}: {exc}"
                ) from exc

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any] | None:
        return self._stages[0](value)

    def on_timer(self, timestamp: int, ctx: Any) -> list[Any] | None:
        kind = CHAIN_EVENT_TIMERS if ctx.time_domain == "event_time" else CHAIN_PROCESSING_TIMERS
        notes = ctx.current.get(kind)
        owners = notes.pop(timestamp, None) if notes else None
        if notes is not None and not notes:
            del ctx.current[kind]
        out: list[Any] = []
        failed = {"key": ctx.current_key, "timestamp": timestamp}
        for i in sorted(owners or ()):
            fn = self.links[i].fn
            assert fn is not None
            emitted = self._guard(i, partial(fn.on_timer, timestamp, self._contexts[i]), failed, "on_timer")
            if emitted and i + 1 < len(self.links):
                emitted = self._onwards(i, emitted)
            if emitted:
                out.extend(emitted)
        return out

    def _guard(self, i: int, call: Callable[[], Iterable[Any] | None], seen: Any, what: str) -> list[Any] | None:
        """Step ``i``'s ``call()``, its output materialised; if it raises, :meth:`_failed`
        (``seen``: its record, or its timer's key and time)."""
        mark = len(self._rt.side) if self.links[i].dead_letter is not None else 0
        try:
            result = call()
            return None if result is None else list(result)
        except UserFunctionError:
            raise
        except Exception as exc:
            self._failed(i, exc, seen, what, mark)
            return None

    def _failed(self, i: int, exc: Exception, seen: Any, what: str, mark: int = 0) -> None:
        """Step ``i`` raised ``exc`` on ``seen``: its dead letter (the side outputs it emitted
        from ``mark`` on discarded), or the job fails, naming the step."""
        link = self.links[i]
        error = f"step '{link.step}': {type(link.fn).__name__}.{what} raised {type(exc).__name__}: {exc}"
        if link.dead_letter is not None:
            self._rt.dead_letter(link.dead_letter, seen, error, discard_from=mark)
            return
        raise UserFunctionError(f"{error} on {record_text(seen)}") from exc

    def _onwards(self, i: int, rows: list[Any]) -> list[Any]:
        """What the steps after step ``i`` make of the rows it emitted."""
        out: list[Any] = []
        following = self._stages[i + 1]
        for row in rows:
            record = self._record(self.links[i], row)
            if self._same_key(self.links[i], self.links[i + 1], record):
                self._extend(out, following(record), i + 1, record)
        return out

    def _extend(self, out: list[Any], got: Iterable[Any] | None, i: int, record: Any) -> None:
        """``out`` extended with what step ``i`` (and those after it) made of ``record``: the last
        step's generator raises as it is read, here, and its failure is named like any other."""
        if got is None:
            return
        try:
            out.extend(got)
        except UserFunctionError:
            raise
        except Exception as exc:
            self._failed(i, exc, record, "process_element")

    @property
    def _stages(self) -> list[Callable[[Any], Iterable[Any] | None]]:
        stages = self.__dict__.get("_built")
        if stages is None:
            stages = self.__dict__["_built"] = self._build()
        return stages

    def _build(self) -> list[Callable[[Any], Iterable[Any] | None]]:
        """Per step, the function taking a record of that step to the chain's output for it:
        the hot path (one call per step and record, the common record shape checked inline)."""
        stages: list[Callable[[Any], Iterable[Any] | None]] = []
        for i in reversed(range(len(self.links))):
            stages.insert(0, self._stage(i, stages[0] if stages else None))
        return stages

    def _stage(self, i: int, following: Callable[[Any], Iterable[Any] | None] | None) -> Callable[[Any], Iterable[Any] | None]:
        link, ctx, rt = self.links[i], self._contexts[i], self._rt
        assert link.fn is not None, "ChainedFunction.bound was not given the window's operator"
        process, guard, failed = link.fn.process_element, self._guard, self._failed
        if following is None:  # the last step
            if link.dead_letter is not None:
                return lambda record: guard(i, lambda: process(record, ctx), record, "process_element")

            def last(record: Any) -> Iterable[Any] | None:
                try:
                    return process(record, ctx)  # a generator raises as it is read: see _extend
                except UserFunctionError:
                    raise
                except Exception as exc:
                    failed(i, exc, record, "process_element")  # raises, naming the step
                    return None
            return last
        fields = link.out_fields
        assert fields is not None, "ChainedFunction.bound was not called"
        shape, key_field = frozenset(fields), (self.links[i + 1].keys[0] if len(self.links[i + 1].keys) == 1 else None)
        slow, extend = self._onwards, self._extend

        dead = link.dead_letter is not None

        def stage(record: Any) -> list[Any] | None:
            mark = len(rt.side) if dead else 0
            try:
                result = process(record, ctx)
                if result is None:
                    return None
                rows = list(result)
            except UserFunctionError:
                raise
            except Exception as exc:
                failed(i, exc, record, "process_element", mark)  # a dead letter, or raises naming the step
                return None
            out: list[Any] = []
            for row in rows:
                if key_field is None or type(row) is not dict or row.keys() != shape or row[key_field] != rt.current_key:
                    out.extend(slow(i, [row]))  # another shape, several key fields, or another key: the careful path
                    continue
                extend(out, following(row), i + 1, row)
            return out
        return stage

    def _record(self, link: ChainLink, row: Any) -> dict[str, Any]:
        """A row step ``link`` emitted as the record the next step reads: a dict of its output
        fields (a missing field is null, as unchained), or a tuple in their order."""
        fields = link.out_fields
        assert fields is not None, "ChainedFunction.bound was not called"
        if type(row) is dict:
            if len(row) == len(fields) and row.keys() == set(fields):
                return row
            return {f: row.get(f) for f in fields}
        if isinstance(row, tuple | list) and len(row) == len(fields):
            return dict(zip(fields, row))
        raise UserFunctionError(
            f"step '{link.step}' emitted {row!r}: a record of its output schema (a dict, or a tuple of "
            f"{len(fields)} values: {', '.join(fields)}) is expected"
        )

    def _same_key(self, link: ChainLink, following: ChainLink, record: dict[str, Any]) -> bool:
        """Whether ``record`` (emitted by ``link``) carries the current key, as the chain
        needs; if not, it is the next step's dead letter, or the job fails."""
        rt = self._rt
        keys = following.keys
        key = record[keys[0]] if len(keys) == 1 else tuple(record[k] for k in keys)
        if key == rt.current_key:
            return True
        error = (f"step '{following.step}' reads '{link.step}' through reinterpret_as_keyed"
                 f"({', '.join(repr(k) for k in keys)}), but '{link.step}' emitted a record with key {key!r} while "
                 f"processing key {rt.current_key!r}: a reinterpreted stream must keep each record's key "
                 f"(key_by re-partitions)")
        if following.dead_letter is not None:
            rt.dead_letter(following.dead_letter, record, error)
            return False
        raise UserFunctionError(f"{error}; record {record_text(record)}")
