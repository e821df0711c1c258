"""An independent model of Flink's event-time semantics, applied at micro-batch boundaries.

Plain Python, no Ember code: the reference Ember's windows and timers are checked against
(issue 16). A job's input is a list of micro-batches of ``(ts_ms, key, value)``. Semantics:

- **Watermark.** Before micro-batch ``k`` the watermark is Flink's bounded-out-of-orderness
  one computed from every earlier batch: ``max timestamp - bound - 1`` (None before any
  record). Spark's is one ms ahead and never below 0; a watermark only moves forward.
- **Windows** (Flink's ``WindowOperator`` with the default event-time trigger, no allowed
  lateness): a window fires once the watermark reaches its last timestamp (``end - 1``),
  i.e. in the first batch whose watermark is at least that — with what it holds *before*
  that batch's records. A record is added to each of its windows whose last timestamp is
  after the watermark; a record none of whose windows is is late: dropped and counted.
  Session windows (gap ``g``) merge a record's ``[ts, ts + g)`` with every open session of
  its key it overlaps or touches; the merged session is late only when it ends at or before
  the watermark + 1.
- **Timers** (a ``KeyedProcessFunction``): an event-time timer fires in the first batch
  whose watermark is at least the timer, before that batch's records; one a record
  registers behind the watermark fires in the same batch, after the records (a timer that
  fired may be registered again and fires again; a pending one is registered once).
- **Count windows** count a key's records (in timestamp order within a batch) and fire in
  the batch of the record that completes them; they do not fire at the end of input.
- At the end of input the watermark moves to the end of time: everything still open fires.
- **In-batch watermark** (``in_batch=True``; Ember's keyed runtime when its step's watermark
  is the query's only one): after a batch's records the step advances to the watermark those
  records make (Flink's periodic watermark) and fires what that makes due in the *same*
  batch, after the records; without it (Spark's native operators) that happens first thing
  in the next batch. Either way the results are the same; only the batch differs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

END = "end"  # the batch label of what fires at the end of input


def flink_watermarks(batches: list[list[tuple]], bound_ms: int, *, after_last: bool = False) -> list[int | None]:
    """The watermark before each micro-batch (None: none yet); ``after_last``: and the one
    after the last batch."""
    out: list[int | None] = []
    wm: int | None = None
    for batch in batches:
        out.append(wm)
        if batch:
            candidate = max(r[0] for r in batch) - bound_ms - 1
            if candidate >= 0 and (wm is None or candidate > wm):  # Spark's never goes below 0 (Flink's -1)
                wm = candidate
    return out + [wm] if after_last else out


def _firing_watermarks(batches: list[list[tuple]], bound_ms: int, in_batch: bool) -> list[tuple[int | None, int | None]]:
    """Per batch: the watermark its records are judged by, and the one that fires what is due
    after them (the same, or with ``in_batch`` the one the batch's records make)."""
    marks = flink_watermarks(batches, bound_ms, after_last=True)
    return [(marks[k], marks[k + 1] if in_batch else marks[k]) for k in range(len(batches))]


@dataclass
class Windowed:
    """What a window job emits: ``(key, start, end) -> (count, sum, batch it fired in)``."""

    fired: dict[tuple, tuple[int, int, int | str]] = field(default_factory=dict)
    late: int = 0


def windows(batches: list[list[tuple]], bound_ms: int, kind: str, size: int, slide: int | None = None, *,
            in_batch: bool = False, keep: Callable[[tuple], bool] | None = None,
            late_by_previous: bool = False) -> Windowed:
    """Count and sum per key and window. ``kind``: tumbling (``size``), sliding (``size``,
    ``slide``) or session (``size`` = the gap). ``keep``: the records the window reads (a
    filter or a split upstream of it), while the watermark follows every record of the
    source, as the job's does. ``late_by_previous``: Spark's rule for an aggregation in a
    query with several stateful operators, not Flink's — a record is late when the watermark
    of the batch *before* its own closed all its windows (it may still join a window its own
    batch's watermark closes)."""
    result = Windowed()
    firing = _firing_watermarks(batches, bound_ms, in_batch)
    if late_by_previous:
        firing = [((firing[k - 1][0] if k else None), fire) for k, (_, fire) in enumerate(firing)]
    if keep is not None:
        batches = [[r for r in b if keep(r)] for b in batches]
    open_: dict[tuple, list[int]] = {}  # (key, start, end) -> [count, sum]

    def fire(k: int, wm: int | None) -> None:
        if wm is not None:
            for w in sorted(w for w in open_ if w[2] - 1 <= wm):
                n, total = open_.pop(w)
                result.fired[w] = (n, total, k)

    for k, (batch, (wm, after)) in enumerate(zip(batches, firing)):
        fire(k, wm)
        for ts, key, value in batch:
            if kind == "session":
                _add_to_session(open_, result, key, ts, value, size, wm)
                continue
            step = slide or size
            last_start = ts - (ts % step)
            starts = [s for s in range(last_start, ts - size, -step) if s <= ts < s + size]
            alive = [(key, s, s + size) for s in starts if wm is None or s + size - 1 > wm]
            if not alive:
                result.late += 1
            for w in alive:
                acc = open_.setdefault(w, [0, 0])
                acc[0] += 1
                acc[1] += value
        fire(k, after)
    for w in sorted(open_):
        n, total = open_[w]
        result.fired[w] = (n, total, END)
    return result


def windows_with_lateness(batches: list[list[tuple]], bound_ms: int, size: int, slide: int | None,
                          lateness_ms: int, *, in_batch: bool = False) -> tuple[list[tuple], int]:
    """Tumbling/sliding windows with allowed lateness: every firing ``(key, start, end, count,
    sum, batch)`` and the late count. A window fires when the watermark reaches its last
    timestamp; until the watermark reaches ``last timestamp + lateness`` (its cleanup) each
    record that joins it fires it again, with everything it holds so far (a key's records in
    timestamp order within a batch); later records are late."""
    rows: list[tuple] = []
    late = 0
    open_: dict[tuple, list[int]] = {}  # (key, start, end) -> [count, sum]
    fired: set[tuple] = set()
    step = slide or size

    def fire(k: int, wm: int | None) -> None:
        if wm is not None:
            for w in sorted(open_):
                if w[2] - 1 <= wm and w not in fired:
                    fired.add(w)
                    rows.append((*w, *open_[w], k))
            for w in [w for w in open_ if w[2] - 1 + lateness_ms <= wm]:  # cleanup
                del open_[w]
                fired.discard(w)

    for k, (batch, (wm, after)) in enumerate(zip(batches, _firing_watermarks(batches, bound_ms, in_batch))):
        fire(k, wm)
        for ts, key, value in sorted(batch, key=lambda r: (r[1], r[0])):
            last_start = ts - (ts % step)
            starts = [s for s in range(last_start, ts - size, -step) if s <= ts < s + size]
            alive = [(key, s, s + size) for s in starts if wm is None or s + size - 1 + lateness_ms > wm]
            if not alive:
                late += 1
            for w in sorted(alive, key=lambda w: w[1]):
                acc = open_.setdefault(w, [0, 0])
                acc[0] += 1
                acc[1] += value
                if wm is not None and w[2] - 1 <= wm:  # a late firing
                    fired.add(w)
                    rows.append((*w, *acc, k))
        fire(k, after)
    for w in sorted(open_):
        if w not in fired:
            rows.append((*w, *open_[w], END))
    return sorted(rows, key=str), late


def count_windows(batches: list[list[tuple]], size: int, slide: int | None = None) -> list[tuple]:
    """Count windows per key (a key's records in timestamp order within a batch): tumbling —
    fires and clears every ``size`` records; sliding — fires every ``slide`` records over the
    key's last ``size`` (Flink: a global window, a count trigger, a count evictor). Firings
    ``(key, count, sum, batch)``, sorted; nothing fires at the end of input."""
    seen: dict[str, list[int]] = {}
    rows = []
    for k, batch in enumerate(batches):
        for _ts, key, value in sorted(batch, key=lambda r: (r[1], r[0])):
            values = seen.setdefault(key, [])
            values.append(value)
            if slide is None and len(values) == size:
                rows.append((key, size, sum(values), k))
                values.clear()
            elif slide is not None and len(values) % slide == 0:
                kept = values[-size:]
                rows.append((key, len(kept), sum(kept), k))
    return sorted(rows)


def _add_to_session(open_: dict[tuple, list[int]], result: Windowed, key: str, ts: int, value: int, gap: int,
                    wm: int | None) -> None:
    start, end, n, total = ts, ts + gap, 1, value
    for w in [w for w in open_ if w[0] == key and w[1] <= ts + gap and w[2] >= ts]:  # overlaps or touches
        acc = open_.pop(w)
        start, end, n, total = min(start, w[1]), max(end, w[2]), n + acc[0], total + acc[1]
    if wm is not None and end - 1 <= wm:
        result.late += n  # only a record that merged with nothing can be late: n == 1 then
        return
    open_[(key, start, end)] = [n, total]


def timer_firings(batches: list[list[tuple]], bound_ms: int, delay_ms: int, *,
                  in_batch: bool = False) -> list[tuple[str, int, int | str]]:
    """A timer ``delay_ms`` after every record: ``(key, timer, batch it fires in)``, sorted
    (a key's timers at one timestamp fire once)."""
    pending: set[tuple[str, int]] = set()
    fired = []
    for k, (batch, (before, after)) in enumerate(zip(batches, _firing_watermarks(batches, bound_ms, in_batch))):
        for before_records in (True, False):  # the watermark fires timers before the batch's records ...
            wm = before if before_records else after
            if not before_records:  # ... which may register timers behind it: those fire in the batch too
                pending |= {(key, ts + delay_ms) for ts, key, _ in batch}
            for key, timer in sorted(t for t in pending if wm is not None and t[1] <= wm):
                pending.discard((key, timer))
                fired.append((key, timer, k))
    fired += [(key, timer, END) for key, timer in sorted(pending)]
    return sorted(fired)


def random_batches(seed: int, *, batches: int = 9, bound_ms: int = 1_000, keys: str = "abc") -> list[list[tuple]]:
    """A seeded out-of-order stream: time advances by up to 3 s per batch; most records lag
    the front by at most the bound (some exactly by it), some far more (late, or not,
    depending on the windows)."""
    rng = random.Random(seed)
    front, out = 2_000, []
    for _ in range(batches):
        front += rng.randint(0, 3_000)
        batch = []
        for _ in range(rng.randint(0, 7)):
            roll = rng.random()
            if roll < 0.2:
                ts = front - rng.randint(bound_ms, 9_000)
            elif roll < 0.3:
                ts = front - bound_ms
            else:
                ts = front - rng.randint(0, bound_ms)
            batch.append((max(ts, 0), rng.choice(keys), rng.randint(1, 9)))
        out.append(batch)
    return out


# --------------------------------------------------------------------------- chained steps
# A step reading another step's output (issue 17): in Flink a step forwards the watermark
# after it fired the timers it made due, so what those timers emit reaches the next step
# *ahead of* that watermark; what the step emits for later records comes after it. The
# model runs each batch as: upstream fires what the batch's watermark made due (output
# timestamp: a window's end - 1) -> downstream takes those results under the previous
# watermark -> downstream's watermark advances and fires -> upstream takes the records.


def _tumbling_results(batches: list[list[tuple]], bound_ms: int, size: int, watermarks: list[int | None] | None = None,
                      late_by_previous: bool = False):
    """Per batch, the (key, end - 1, count, sum) results a tumbling count/sum window emits
    when the batch's watermark fires them (the last entry: at the end of input), and the
    records it dropped late. ``watermarks``: per batch, when not the batches' own;
    ``late_by_previous``: records judged by the watermark of the batch before theirs (Spark's
    rule in a query of several stateful operators, as in :func:`windows`)."""
    per_batch: list[list[tuple]] = []
    open_: dict[tuple, list[int]] = {}
    late = 0
    marks = watermarks or flink_watermarks(batches, bound_ms)
    for k, wm in enumerate(marks):  # (watermarks may go one past the batches: after the last)
        batch = batches[k] if k < len(batches) else []
        if not late_by_previous:  # Flink's order: what the watermark makes due fires before the batch's records
            due = sorted(w for w in open_ if wm is not None and w[2] - 1 <= wm)
            per_batch.append([(w[0], w[2] - 1, *open_.pop(w)) for w in due])
        judge = (marks[k - 1] if k else None) if late_by_previous else wm
        for ts, key, value in batch:
            start = ts - ts % size
            if judge is not None and start + size - 1 <= judge:
                late += 1
                continue
            acc = open_.setdefault((key, start, start + size), [0, 0])
            acc[0] += 1
            acc[1] += value
        if late_by_previous:  # Spark's aggregation: the batch's records first, then what its watermark evicts
            due = sorted(w for w in open_ if wm is not None and w[2] - 1 <= wm)
            per_batch.append([(w[0], w[2] - 1, *open_.pop(w)) for w in due])
    per_batch.append([(w[0], w[2] - 1, *open_.pop(w)) for w in sorted(open_)])
    return per_batch, late


def window_of_windows(batches: list[list[tuple]], bound_ms: int, size: int, outer: int) -> Windowed:
    """A tumbling count/sum window of ``size`` whose results feed a tumbling window of
    ``outer`` summing their counts and sums: ``(key, start, end) -> (count, sum, batch)``."""
    per_batch, late = _tumbling_results(batches, bound_ms, size)
    result = Windowed(late=late)
    watermarks = [*flink_watermarks(batches, bound_ms), None]
    open_: dict[tuple, list[int]] = {}
    for k, results in enumerate(per_batch):
        before, wm = (watermarks[k - 1] if k else None), watermarks[k]
        for key, ts, n, total in results:  # ahead of the watermark that fired them
            start = ts - ts % outer
            if before is not None and start + outer - 1 <= before:
                result.late += n
                continue
            acc = open_.setdefault((key, start, start + outer), [0, 0])
            acc[0] += n
            acc[1] += total
        last = k == len(per_batch) - 1
        for w in sorted(w for w in open_ if last or (wm is not None and w[2] - 1 <= wm)):
            n, total = open_.pop(w)
            result.fired[w] = (n, total, END if last else k)
    return result


def window_of_results_and_records(results: list[list[tuple]], records: list[list[tuple]],
                                  watermarks: list[int | None], size: int, n_batches: int) -> Windowed:
    """A tumbling count/sum window reading, through a union, an upstream window's
    ``results`` per batch (``(key, end - 1, count, sum)``, as :func:`tumbling_results` gives
    them: emitted ahead of the watermark that fired them, so judged by the batch before's)
    and ``records`` per batch (``(ts, key, value)``, judged by their batch's watermark), on
    one watermark per batch (``watermarks``, the query's). Each late result or record counts
    one (Flink counts records). Labels: batches from ``n_batches`` on are the end of input's."""
    result = Windowed()
    open_: dict[tuple, list[int]] = {}

    def add(key: str, ts: int, n: int, total: int, judge: int | None) -> None:
        start = ts - ts % size
        if judge is not None and start + size - 1 <= judge:
            result.late += 1
            return
        acc = open_.setdefault((key, start, start + size), [0, 0])
        acc[0] += n
        acc[1] += total

    steps = max(len(results), len(records))
    for k in range(steps):
        before = watermarks[k - 1] if 0 < k <= len(watermarks) else None
        now = watermarks[k] if k < len(watermarks) else None
        for key, ts, n, total in results[k] if k < len(results) else []:
            add(key, ts, n, total, before)
        for ts, key, value in records[k] if k < len(records) else []:
            add(key, ts, 1, value, now)
        last = k == steps - 1
        for w in sorted(w for w in open_ if last or (now is not None and w[2] - 1 <= now)):
            n, total = open_.pop(w)
            result.fired[w] = (n, total, END if k >= n_batches else k)
    return result


def window_then_timers(batches: list[list[tuple]], bound_ms: int, size: int, delay_ms: int,
                       keep: Callable[[str, int], bool] | None = None):
    """A tumbling count window whose results feed a process function that reports each
    result's timestamp and the watermark it sees, and sets a timer ``delay_ms`` after it.
    Returns the sorted ``(key, window end, count, timestamp, watermark seen, batch)`` rows
    (the watermark seen is not modelled for results of the end of input: "?") and
    ``(key, timer, batch it fires in)`` rows. ``keep(key, count)``: the results a filter
    between the two lets through (the others reach the process function not at all)."""
    per_batch, _ = _tumbling_results(batches, bound_ms, size)
    watermarks = [*flink_watermarks(batches, bound_ms), None]
    seen, fired, pending = [], [], set()
    for k, results in enumerate(per_batch):
        last = k == len(per_batch) - 1
        label = END if last else k
        before, wm = (watermarks[k - 1] if k else None), watermarks[k]
        for key, ts, n, _total in results:
            if keep is not None and not keep(key, n):
                continue
            seen.append((key, ts + 1, n, ts, "?" if last else before, label))
            pending.add((key, ts + delay_ms))
        for key, timer in sorted(t for t in pending if last or (wm is not None and t[1] <= wm)):
            pending.discard((key, timer))
            fired.append((key, timer, label))
    return sorted(seen, key=str), sorted(fired, key=str)


def rolling(batches: list[list[tuple]], kind: str) -> list[tuple]:
    """Flink's rolling aggregation of ``value`` per key (``KeyedStream.reduce``/``sum``/``min``/
    ``max``/``minBy``/``maxBy``): one output per record, in each key's timestamp order within a
    batch, ``(batch, key, ts of the record carried, value)``. ``sum``/``min``/``max`` carry the
    key's first record with the aggregate as its value; ``min_by``/``max_by`` the record holding
    the extreme (the earlier on ties); ``reduce`` here adds values and keeps the later record."""
    acc: dict[str, tuple[int, int]] = {}  # key -> (ts carried, value)
    out: list[tuple] = []
    for k, batch in enumerate(batches):
        for ts, key, value in sorted(batch, key=lambda r: (r[1], r[0])):
            prev = acc.get(key)
            if prev is None:
                new = (ts, value)
            elif kind == "sum":
                new = (prev[0], prev[1] + value)
            elif kind == "min":
                new = (prev[0], min(prev[1], value))
            elif kind == "max":
                new = (prev[0], max(prev[1], value))
            elif kind == "min_by":
                new = (ts, value) if value < prev[1] else prev
            elif kind == "max_by":
                new = (ts, value) if value > prev[1] else prev
            else:  # reduce: a + b on the value, the later record's timestamp
                new = (ts, prev[1] + value)
            acc[key] = new
            out.append((k, key, *new))
    return out


# --------------------------------------------------------------------------- interval join
# Flink's interval join (issue 17) at micro-batch granularity: before micro-batch k the join's
# watermark is the least of its two inputs' (each ``max - bound - 1`` over earlier batches; an
# input without records yet does not count, as in Spark), and it never goes back; a record with
# ``ts`` below it is late:
# dropped and counted. Every two records that are not late, with equal keys and
# ``left.ts + lower <= right.ts <= left.ts + upper``, make a pair, emitted in the batch of the
# later of the two. An outer join also emits each record that is not late and has no partner
# (by the end of input).


def two_input_watermarks(first: list[list[tuple]], second: list[list[tuple]], bound_ms: int, *,
                         after_last: bool = False) -> list[int | None]:
    """The watermark of a two-input step before each micro-batch (:func:`least_watermarks`)."""
    return least_watermarks([first, second], bound_ms, after_last=after_last)


def least_watermarks(inputs: list[list[list[tuple]]], bound_ms: int, *, after_last: bool = False) -> list[int | None]:
    """The watermark of a query with several sources before each micro-batch: the least of
    the sources' (each ``max - bound - 1`` over earlier batches; a source without records
    yet does not count, as in Spark), never going back; None before any source has one.
    ``after_last``: and the one after the last batch (before the end of input's)."""
    marks: list[int | None] = [None] * len(inputs)
    wm: int | None = None
    out: list[int | None] = []
    for k in range(max(map(len, inputs)) + (1 if after_last else 0)):
        present = [m for m in marks if m is not None]
        if present and (wm is None or min(present) > wm):
            wm = min(present)
        out.append(wm)
        for side, batches in enumerate(inputs):
            batch = batches[k] if k < len(batches) else []
            if batch:
                candidate = max(r[0] for r in batch) - bound_ms - 1
                if marks[side] is None or candidate > marks[side]:
                    marks[side] = candidate
    return out


@dataclass
class Joined:
    pairs: list[tuple] = field(default_factory=list)  # (batch, key, left ts, left v, right ts, right v)
    unmatched_left: list[tuple] = field(default_factory=list)  # (key, ts, v)
    unmatched_right: list[tuple] = field(default_factory=list)
    late: int = 0


def interval_join(left: list[list[tuple]], right: list[list[tuple]], bound_ms: int, lower: int, upper: int, *,
                  watermarks: list[int | None] | None = None) -> Joined:
    """``watermarks``: the join's watermark before each batch, when both sides come from one
    source (its ``least_watermarks``); by default each side is a source of its own."""
    out = Joined()
    kept: list[list[tuple]] = [[], []]  # (batch, ts, key, v) of records that are not late
    for k, wm in enumerate(watermarks if watermarks is not None else two_input_watermarks(left, right, bound_ms)):
        for side, batches in enumerate((left, right)):
            batch = batches[k] if k < len(batches) else []
            for ts, key, v in batch:
                if wm is not None and ts < wm:
                    out.late += 1
                else:
                    kept[side].append((k, ts, key, v))
    matched: tuple[set, set] = (set(), set())
    for i, (bl, lts, lkey, lv) in enumerate(kept[0]):
        for j, (br, rts, rkey, rv) in enumerate(kept[1]):
            if lkey == rkey and lts + lower <= rts <= lts + upper:
                out.pairs.append((max(bl, br), lkey, lts, lv, rts, rv))
                matched[0].add(i)
                matched[1].add(j)
    out.unmatched_left = [(key, ts, v) for i, (_, ts, key, v) in enumerate(kept[0]) if i not in matched[0]]
    out.unmatched_right = [(key, ts, v) for j, (_, ts, key, v) in enumerate(kept[1]) if j not in matched[1]]
    return out


def split_evenly(records: list[tuple], parts: int) -> list[list[tuple]]:
    """``records`` (in arrival order) cut into ``parts`` consecutive micro-batches."""
    size = -(-len(records) // parts) if records else 0
    return [records[i * size:(i + 1) * size] for i in range(parts)]


# --------------------------------------------------------------------------- two connected streams
# A KeyedCoProcessFunction (issue 17) over events (ts, key, v) and rules (ts, key, limit): a rule
# sets its key's limit and an event-time timer at ts + expiry that clears it again; an event above
# its key's limit is an alert. Watermark as for the interval join (the least of the two inputs');
# timers fire as for one input (first batch whose watermark reaches them, before its records; the
# rest at the end); within a batch a key's records of both streams go in timestamp order.


def thresholds(events: list[list[tuple]], rules: list[list[tuple]], bound_ms: int, expiry_ms: int, *,
               ahead: list[list[tuple]] | None = None) -> list[tuple]:
    """``ahead``: the first input is a keyed step's output instead of ``events`` (which then
    only make the watermark, as the source before that step): per batch, then for the
    watermark after the last batch, then for the end of input, the records that step emitted
    ahead of the batch's watermark (results its timers fired); they reach this step first,
    before its own timers fire. What happens after the last batch is labelled END."""
    out: list[tuple] = []
    limits: dict[str, int] = {}
    timers: dict[str, set[int]] = {}

    def fire(label: int | str, upto: float) -> None:
        due = sorted((t, key) for key, ts in timers.items() for t in ts if t <= upto)
        for t, key in due:
            timers[key].discard(t)
            limits.pop(key, None)
            out.append((label, "expired", key, t))

    def check(label: int | str, ts: int, key: str, v: int) -> None:
        if key in limits and v > limits[key]:
            out.append((label, "alert", key, ts))

    last = max(len(events), len(rules))
    for k, wm in enumerate(two_input_watermarks(events, rules, bound_ms, after_last=ahead is not None)):
        label = k if k < last else END
        for ts, key, v in sorted(ahead[k]) if ahead is not None else []:
            check(label, ts, key, v)
        if wm is not None:
            fire(label, wm)
        batch = [] if ahead is not None else [(ts, 1, key, v) for ts, key, v in (events[k] if k < len(events) else [])]
        batch += [(ts, 2, key, v) for ts, key, v in (rules[k] if k < len(rules) else [])]
        for ts, side, key, v in sorted(batch):
            if side == 2:
                limits[key] = v
                timers.setdefault(key, set()).add(ts + expiry_ms)
            else:
                check(label, ts, key, v)
        if wm is not None:
            fire(label, wm)  # registered behind the watermark: the same batch, after its records
    for ts, key, v in sorted(ahead[-1]) if ahead is not None else []:
        check(END, ts, key, v)
    fire(END, float("inf"))
    return out


def tumbling_results(batches: list[list[tuple]], bound_ms: int, size: int,
                     watermarks: list[int | None] | None = None,
                     late_by_previous: bool = False) -> tuple[list[list[tuple]], int]:
    """A tumbling count/sum window's results ``(key, end - 1, count, sum)`` per batch whose
    watermark fires them (the last entry: at the end of input), and how many records it
    dropped late. ``watermarks``: per batch, when not the batches' own; ``late_by_previous``:
    Spark's late rule with several stateful operators (:func:`windows`)."""
    return _tumbling_results(batches, bound_ms, size, watermarks, late_by_previous)


def tumbling_sums(batches: list[list[tuple]], bound_ms: int, size: int,
                  watermarks: list[int | None] | None = None) -> list[list[tuple]]:
    """A tumbling window's results as records ``(end - 1, key, sum)``, per batch whose
    watermark fires them (fired first thing in it), and last those of the end of input.
    ``watermarks``: per batch, when not the batches' own (Spark keeps one watermark per
    query: the least of all its sources')."""
    per_batch, _ = _tumbling_results(batches, bound_ms, size, watermarks)
    return [[(ts, key, total) for key, ts, _n, total in results] for results in per_batch]


def broadcast_rules(events: list[list[tuple]], rules: list[list[tuple]], bound_ms: int, expiry_ms: int) -> list[tuple]:
    """Flink's KeyedBroadcastProcessFunction of tests/integration/test_broadcast.py: rules
    ``(ts, name, limit)`` set (limit >= 0) or remove (< 0) a named limit in broadcast state,
    ``reset`` clears every key's alert count (apply_to_keyed_state); events ``(ts, key, v)``
    above a rule's limit are alerts, counted per key; a key's first alert sets a timer
    ``expiry_ms`` later that reports and clears its count. Within a batch records go in
    timestamp order, a rule before an event of the same timestamp; timers as in ``thresholds``."""
    out: list[tuple] = []
    limits: dict[str, int] = {}
    alerts: dict[str, int] = {}
    timers: dict[str, set[int]] = {}

    def fire(label: int | str, upto: float) -> None:
        for t, key in sorted((t, key) for key, ts in timers.items() for t in ts if t <= upto):
            timers[key].discard(t)
            out.append((label, "summary", key, t, alerts.pop(key, 0)))

    for k, wm in enumerate(two_input_watermarks(events, rules, bound_ms)):
        if wm is not None:
            fire(k, wm)
        batch = [(ts, 0, name, limit) for ts, name, limit in (rules[k] if k < len(rules) else [])]
        batch += [(ts, 1, key, v) for ts, key, v in (events[k] if k < len(events) else [])]
        for ts, side, a, b in sorted(batch):
            if side == 0:
                if a == "reset":
                    alerts.clear()
                elif b < 0:
                    limits.pop(a, None)
                else:
                    limits[a] = b
                out.append((k, "rule", a, ts, len(limits)))
                continue
            for name, limit in sorted(limits.items()):
                if b > limit:
                    alerts[a] = n = alerts.get(a, 0) + 1
                    if n == 1:
                        timers.setdefault(a, set()).add(ts + expiry_ms)
                    out.append((k, "alert", f"{a}:{name}", ts, n))
        if wm is not None:
            fire(k, wm)
    fire(END, float("inf"))
    return out


def _joined(label: int | str, key: str, lefts: list, rights: list, outer: tuple[bool, bool]) -> list[tuple]:
    """A join window's output rows: every pair, and in an outer join each record of a side without partners."""
    out = [(label, key, lt, lv, rt, rv) for lt, lv in lefts for rt, rv in rights]
    if outer[0] and not rights:
        out += [(label, key, lt, lv, None, None) for lt, lv in lefts]
    if outer[1] and not lefts:
        out += [(label, key, None, None, rt, rv) for rt, rv in rights]
    return out


def window_join(left: list[list[tuple]], right: list[list[tuple]], bound_ms: int, size_ms: int, slide_ms: int,
                how: str = "inner") -> tuple[list[tuple], int]:
    """Flink's window join (tumbling: ``slide_ms == size_ms``) of ``(ts, key, v)`` records batch
    by batch: ``((batch, key, left ts, left v, right ts, right v) ..., late records)``. A record
    goes into each of its windows whose last timestamp ``end - 1`` is after the watermark (none:
    late, dropped and counted); a window fires when the watermark reaches ``end - 1`` — before
    a batch's records and after them — emitting its pairs, and in an outer join (Flink's
    coGroup) each record of a side without partners in it, the other side None."""
    windows: dict[tuple[str, int], tuple[list, list]] = {}
    out: list[tuple] = []
    late = 0
    outer = (how in ("left_outer", "full_outer"), how in ("right_outer", "full_outer"))

    def assign(ts: int) -> list[int]:
        last = ts - ts % slide_ms
        return list(range(last, ts - size_ms, -slide_ms))

    def fire(label: int | str, upto: float) -> None:
        for key, start in sorted(k for k in windows if k[1] + size_ms - 1 <= upto):
            out.extend(_joined(label, key, *windows.pop((key, start)), outer))

    for k, wm in enumerate(two_input_watermarks(left, right, bound_ms)):
        if wm is not None:
            fire(k, wm)
        for side, batches in enumerate((left, right)):
            for ts, key, v in (batches[k] if k < len(batches) else []):
                starts = [s for s in assign(ts) if wm is None or s + size_ms - 1 > wm]
                if not starts:
                    late += 1
                for s in starts:
                    windows.setdefault((key, s), ([], []))[side].append((ts, v))
    fire(END, float("inf"))
    return out, late


def session_window_join(left: list[list[tuple]], right: list[list[tuple]], bound_ms: int, gap_ms: int,
                        how: str = "inner") -> tuple[list[tuple], int]:
    """Flink's window join with event-time session windows (gap ``gap_ms``) of ``(ts, key, v)``
    records batch by batch, as :func:`window_join` reports it. Flink windows the union of both
    streams, so a session merges records of either side: a record's ``[ts, ts + gap)`` merges
    with every open session of its key it overlaps or touches; a record that merges with none
    and whose session ends at or before the watermark + 1 is late. Within a batch a key's
    records (both sides) are taken in timestamp order. A session fires when the watermark
    reaches its last timestamp (``end - 1``), before a batch's records."""
    sessions: list[list] = []  # [key, start, end, lefts, rights]
    out: list[tuple] = []
    late = 0
    outer = (how in ("left_outer", "full_outer"), how in ("right_outer", "full_outer"))

    def fire(label: int | str, upto: float) -> None:
        for s in sorted((s for s in sessions if s[2] - 1 <= upto), key=lambda s: (s[0], s[1])):
            sessions.remove(s)
            key, _, _, lefts, rights = s
            out.extend(_joined(label, key, lefts, rights, outer))

    for k, wm in enumerate(two_input_watermarks(left, right, bound_ms)):
        if wm is not None:
            fire(k, wm)
        records = [(ts, side, key, v) for side, batches in enumerate((left, right))
                   for ts, key, v in (batches[k] if k < len(batches) else [])]
        for ts, side, key, v in sorted(records, key=lambda r: r[0]):
            start, end = ts, ts + gap_ms
            touched = [s for s in sessions if s[0] == key and s[1] <= end and s[2] >= start]
            if not touched and wm is not None and end - 1 <= wm:
                late += 1
                continue
            merged = [key, min([start] + [s[1] for s in touched]), max([end] + [s[2] for s in touched]), [], []]
            for s in touched:
                sessions.remove(s)
                merged[3] += s[3]
                merged[4] += s[4]
            merged[3 + side].append((ts, v))
            sessions.append(merged)
    fire(END, float("inf"))
    return out, late
