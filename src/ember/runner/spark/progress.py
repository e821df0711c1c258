"""Following a running query: each progress report once, the events it counted,
what waits in the sources, and the progress lines a user sees.

Spark reports a batch's input rows; Ember corrects them where its own rows are
not the user's events (the end-of-input row) or one row carries many events (a
source packing records per state bucket), and reads the backlog from offsets
of sources that report it.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from ember.job import RunListener
from ember.time.clock import Clock

LATE_METRIC_PREFIX = "ember_late_records:"  # an observed metric: one native window step's late records

__all__ = ["ProgressFollower", "PROGRESS_EVERY_S", "offsets_events", "events_per_source", "all_done"]

PROGRESS_EVERY_S = 5.0
JOIN_OPERATOR = "symmetricHashJoin"  # Spark's name of a stream-stream join in stateOperators


class ProgressFollower:
    """Collects progress reports (each batch once) and shows progress."""

    def __init__(self, progress: Callable[[dict[str, Any]], None] | bool, name: str, clock: Clock, *,
                 spark_late_rows: bool = True, listener: RunListener | None = None) -> None:
        """``spark_late_rows``: count the late rows Spark's stateful operators report
        (``numRowsDroppedByWatermark``) besides the late records Ember's native windows
        count themselves (observed metrics named ``ember_late_records:<step>``)."""
        self.callback = progress if callable(progress) else None
        self.listener = listener
        self.counted_late: Callable[[], int] = lambda: 0  # late records Ember's operators count themselves (accumulators)
        # Observed metric name -> reader: a sink Spark writes natively learns its batches here.
        self.metric_readers: dict[str, Callable[[int, dict[str, Any]], None]] = {}
        self.verbose = progress is True
        self.name = name
        self.clock = clock
        self.progress: list[dict[str, Any]] = []
        self.seen: set[int] = set()
        self.events = 0
        self.late_dropped = 0
        self.spark_late_rows = spark_late_rows
        self.processing_ms = 0
        self.last_batch = -1
        self.unreported: dict[int, int | None] = {}  # committed batches Spark never reported: their events (None: unknown)
        self.eos_batch: int | None = None  # the batch that read the end-of-input row
        self.ended_earlier = False  # the end-of-input row was read by an earlier run
        self.last_print = clock.monotonic()
        self.events_at_print = 0

    def poll(self, query: Any) -> bool:
        """Record new progress reports; cheap when nothing changed (one JVM call)."""
        last = query._jsq.lastProgress()  # the JVM object: reading batchId parses nothing
        bid = None if last is None else int(last.batchId())
        if bid is None or bid in self.seen:
            new = False
        elif self.last_batch >= 0 and bid == self.last_batch + 1:
            new = self._record(json.loads(last.json()))
        else:  # the first report, or batches went by between polls: take them from this run's history
            new = False
            for p in sorted(query.recentProgress, key=lambda r: int(r.batchId)):
                if int(p.batchId) not in self.seen:
                    new = self._record(json.loads(p.json)) or new
        if self.verbose and self.clock.monotonic() - self.last_print >= PROGRESS_EVERY_S:
            self._print()
        return new

    def _record(self, report: dict[str, Any]) -> bool:
        bid = int(report["batchId"])
        if bid in self.seen:
            return False
        self.seen.add(bid)
        self.progress.append(report)
        sources = report.get("sources", [])
        offsets = [_offset(s.get("endOffset")) for s in sources]
        report["numInputRows"] = _events(report, sources, offsets)
        self.events += report["numInputRows"]
        lag = _lag(sources)
        if lag is not None:
            report["lag"] = lag
        self.processing_ms += int(report.get("durationMs", {}).get("triggerExecution", 0))
        self.last_batch = max(self.last_batch, bid)
        observed = report.get("observedMetrics") or {}
        for metric_name, read in self.metric_readers.items():
            if metric_name in observed:
                read(bid, observed[metric_name])
        dropped = sum(
            int(metric.get("records") or 0) for metric_name, metric in observed.items()
            if metric_name.startswith(LATE_METRIC_PREFIX)
        )
        dropped += sum(  # a stream-stream join's input rows are records: Spark's count is exact there
            int(op.get("numRowsDroppedByWatermark") or 0) for op in report.get("stateOperators", [])
            if self.spark_late_rows or op.get("operatorName") == JOIN_OPERATOR
        )
        if dropped:
            self.late_dropped += dropped
            print(
                f"[ember] {self.name}: batch {bid} dropped {dropped} late record(s) behind the watermark",
                file=sys.stderr, flush=True,
            )
        for source, end in zip(sources, offsets):
            if end.get("ended") != 1 or self.eos_batch is not None:
                continue
            if _offset(source.get("startOffset")).get("ended") == 1:
                # A restart of a job whose input ended in an earlier run: the end-of-input row
                # will not come again, and the watermark is at the end of time already.
                self.ended_earlier = True
            else:
                self.eos_batch = bid  # this batch read the end-of-input row
        if self.callback:
            self.callback(report)
        if self.listener is not None:
            report["lateRecordsTotal"] = self.late_dropped + self.counted_late()
            self.listener.batch_reported(report)
        return True

    def account_unreported(self, checkpoint: str, since: int, committed: int) -> None:
        """Batches ``since + 1 .. committed`` that Spark committed but never reported: a stop
        that lands between a batch's commit and its progress report (the query is stopped when
        a batch overruns the grace of a graceful stop). Their output stands — the next run
        starts after them — so their events count too, from the offset log where the sources'
        offsets say how many (Ember's generators and Redis streams); elsewhere the result
        misses them, said on stderr, never silently."""
        from ember.runner.spark.checkpoint import offset_log_entry

        for bid in range(since + 1, committed + 1):
            if bid in self.seen or bid in self.unreported:
                continue
            try:
                end = offset_log_entry(checkpoint, bid)[1]
            except OSError:
                end = None
            try:
                start = offset_log_entry(checkpoint, bid - 1)[1] if bid > 0 else []
            except OSError:
                start = None
            events = None if end is None or start is None else offsets_events(start, end)
            self.unreported[bid] = events
            self.last_batch = max(self.last_batch, bid)
            if events is None:
                print(f"[ember] {self.name}: batch {bid} was committed as the query stopped, before Spark reported "
                      "its progress; its sources' offsets do not say how many events it read: the result's event "
                      "count misses them (its output is kept)", file=sys.stderr, flush=True)
            else:
                self.events += events

    def _print(self) -> None:
        now = self.clock.monotonic()
        rate = (self.events - self.events_at_print) / max(1e-9, now - self.last_print)
        last = self.progress[-1] if self.progress else {}
        wm = last.get("eventTime", {}).get("watermark", "-")
        took = last.get("durationMs", {}).get("triggerExecution", "-")
        lag = f", lag {last['lag']:,} records" if "lag" in last else ""
        print(
            f"[ember] {self.name}: {self.events:,} events, {rate:,.0f} events/s, "
            f"batch {last.get('batchId', '-')} took {took} ms, watermark {wm}{lag}",
            file=sys.stderr, flush=True,
        )
        self.last_print, self.events_at_print = now, self.events

    def sources_done(self, expected: int) -> bool:
        if not self.progress:
            return False
        return all_done([s.get("endOffset") for s in self.progress[-1].get("sources", [])], expected)

    def end_of_input_seen_before(self, batch: int) -> bool:
        return self.eos_batch is not None and batch > self.eos_batch


def _events(report: dict[str, Any], sources: list[dict[str, Any]], offsets: list[dict[str, Any]]) -> int:
    """The batch's input events: Spark's row count, except that the end-of-input
    row is Ember's, not the user's, and a source packing its records per state
    bucket (keyed/packing.py) counts events by its offsets (``n``), not rows."""
    total = int(report.get("numInputRows") or 0)
    for source, end in zip(sources, offsets):
        if "ended" in end or end.get("packed"):
            total -= int(source.get("numInputRows") or 0)
        if end.get("packed"):
            total += int(end["n"]) - int(_offset(source.get("startOffset")).get("n", 0))
    return total


def offsets_events(start: list[Any], end: list[Any]) -> int | None:
    """The events read between two offset-log entries (one offset per source, in the same
    order), where every source's offset carries a count (:func:`events_per_source`). None
    otherwise."""
    counts = events_per_source(start, end)
    return None if any(n is None for n in counts) else sum(n or 0 for n in counts)


def events_per_source(start: list[Any], end: list[Any]) -> list[int | None]:
    """Per source (the offset log's order), the events read between two offset-log entries,
    where its offset carries a count: Ember's generators (``n``; on Spark's
    ``rate-micro-batch``, ``offset``), Redis streams (``read`` per stream), the end-of-input
    marker (0: no user events); None for any other source."""
    out: list[int | None] = []
    for i, raw in enumerate(end):
        to, since = _offset(raw), _offset(start[i]) if i < len(start) else {}
        if "ended" in to:
            out.append(0)
        elif "n" in to:
            out.append(int(to["n"]) - int(since.get("n", 0)))
        elif isinstance(to.get("offset"), int) and "timestamp" in to:  # Spark's rate-micro-batch: rows so far
            out.append(int(to["offset"]) - int(since.get("offset", 0)))
        elif isinstance(to.get("read"), dict):
            read = since.get("read")
            before: dict[str, Any] = read if isinstance(read, dict) else {}
            out.append(sum(int(v) - int(before.get(k, 0)) for k, v in to["read"].items()))
        else:
            out.append(None)
    return out


def _lag(sources: list[dict[str, Any]]) -> int | None:
    """Records waiting in sources that report them, after the batch: entries added
    minus read (Redis streams), events due minus admitted (rate-limited generators)."""
    total, known = 0, False
    for s in sources:
        end = _offset(s.get("endOffset"))
        # (a source read in the driver reports its backlog in the end offset: in_driver.InDriver)
        added, read = _offset(s.get("latestOffset")).get("added") or end.get("added"), end.get("read")
        if isinstance(added, dict) and isinstance(read, dict):
            total += sum(max(0, int(added[k]) - int(read.get(k, 0))) for k in added)
            known = True
        elif "due" in end and "n" in end:
            total += max(0, int(end["due"]) - int(end["n"]))
            known = True
    return total if known else None


def all_done(offsets: list[Any], expected: int) -> bool:
    """Whether ``offsets`` (one per source, as reported or logged) carry at least ``expected``
    ``done`` flags (the bounded sources'), all true: every bounded source read to its end."""
    done = [o["done"] for o in map(_offset, offsets) if "done" in o]
    return len(done) >= expected and all(done)


def _offset(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}
