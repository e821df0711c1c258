"""Replayable generator sources for the seed workloads (WORKLOADS.md E1, E2, E4, E5).

Every generated record is a pure function of ``(seed, seq)``, where ``seq`` is
the record's global sequence number. Partition ``p`` of ``P`` owns the
sequence numbers ``seq % P == p``; its offset ``o`` holds ``seq = o * P + p``.
So the data at offsets ``[a, b)`` of a partition is a pure function of
``(seed, partition, a, b)`` and a replayed micro-batch is identical.

Event time is ``start_ms + seq * 1000 // events_per_second`` (plus the
workload's own skew), where ``events_per_second`` is the target ``rate`` or,
for unbounded-speed runs, ``nominal_rate``. ``start_ms`` is fixed on a job's
first start and kept in its checkpoint, so replays keep their timestamps.

This module holds the declarations and numpy *reference models* of the
generators; the Spark runner compiles the same definitions to Spark SQL.
The two are checked against each other by the integration tests, and the
reference models compute expected results for verification.
"""

from __future__ import annotations

import functools
import json
import random
import re
import uuid
from dataclasses import dataclass

import numpy as np

from ember.connectors.base import Source
from ember.connectors.hashing import spark_xxhash64
from ember.errors import ConfigError

__all__ = [
    "GeneratorSource",
    "YahooSource",
    "GrepSource",
    "GroupingSource",
    "StateMachineSource",
    "AdClickSource",
    "RuleSource",
    "AD_TYPES",
    "EVENT_TYPES",
    "dictionary_words",
]

AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
EVENT_TYPES = ("view", "click", "purchase")


@dataclass(frozen=True)
class GeneratorSource(Source):
    """Common knobs of every generator.

    - ``rate``: target events/s (open loop: record ``seq`` is due at
      ``start_ms + seq / rate``); ``None`` = as fast as Spark reads.
    - ``partitions``: number of source partitions.
    - ``max_events_per_batch``: admission-control bound per micro-batch
      (``None`` = the environment's bound).
    - ``max_events``: stop after this many events (a bounded source).
    - ``seed``: changes every generated value.
    - ``nominal_rate``: events per second of event time when ``rate`` is None.
    - ``start_ms``: fixes the event-time origin (default: the job's first start).
    """

    rate: float | None = None
    partitions: int = 2
    max_events_per_batch: int | None = None
    max_events: int | None = None
    seed: int = 0
    nominal_rate: int = 1_000_000
    start_ms: int | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.rate is not None and not (isinstance(self.rate, (int, float)) and self.rate > 0):
            raise ConfigError(f"{name}: rate must be a positive number of events/s or None, got {self.rate!r}")
        _positive_int(name, "partitions", self.partitions)
        _positive_int(name, "nominal_rate", self.nominal_rate)
        if self.max_events_per_batch is not None:
            _positive_int(name, "max_events_per_batch", self.max_events_per_batch)
        if self.max_events is not None:
            _positive_int(name, "max_events", self.max_events)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"{name}: seed must be an int, got {self.seed!r}")

    @property
    def bounded(self) -> bool:
        return self.max_events is not None

    @property
    def events_per_second(self) -> float:
        return float(self.rate) if self.rate is not None else float(self.nominal_rate)

    @property
    def needs_python_driver(self) -> bool:
        """Rate-limited, bounded and numpy-generated sources use Ember's Python
        sequence source; unbounded-speed SQL generators use Spark's native
        ``rate-micro-batch`` (measured faster, see docs/design/core.md)."""
        return self.rate is not None or self.max_events is not None

    def describe(self) -> str:
        rate = f"{self.rate:,.0f} ev/s" if self.rate else "unbounded speed"
        bound = f", {self.max_events:,} events" if self.max_events else ""
        return f"{type(self).__name__}({rate}, {self.partitions} partitions{bound}, seed {self.seed})"

    # -- reference model helpers -------------------------------------------------
    def seqs(self, start: int, end: int) -> np.ndarray:
        """The global sequence numbers ``[start, end)`` as int64."""
        return np.arange(start, end, dtype=np.int64)

    def event_time_ms(self, seq: np.ndarray, start_ms: int) -> np.ndarray:
        return start_ms + (seq * 1000) // int(self.events_per_second)

    def hash(self, seq: np.ndarray) -> np.ndarray:
        return spark_xxhash64(seq, np.full_like(seq, self.seed))


def _positive_int(owner: str, what: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{owner}: {what} must be a positive int, got {value!r}")


# --------------------------------------------------------------------------- Yahoo (E5)
@dataclass(frozen=True)
class YahooSource(GeneratorSource):
    """Yahoo streaming benchmark ad events (WORKLOADS.md E5).

    Schema: ``user_id, page_id, ad_id, ad_type, event_type, event_time (ms as
    a string), ip_address``. 100 campaigns x 10 ads; every field uniform.
    ``skew_ms`` spreads event times by up to +-skew (out-of-order events).

    ``as_json=True``: each event arrives as one JSON text in the field ``event``
    (``{"user_id":"...",...,"ip_address":"1.2.3.4"}``, as a broker would carry
    it), made by Ember's Python reader; decode it with ``parse_json``.
    ``malformed_every=N`` (with ``as_json``) cuts the closing brace off every
    N-th event (``seq % N == N - 1``): invalid JSON, for dead-letter handling;
    the reference model leaves those events out.
    """

    campaigns: int = 100
    ads_per_campaign: int = 10
    skew_ms: int = 0
    as_json: bool = False
    malformed_every: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("YahooSource", "campaigns", self.campaigns)
        _positive_int("YahooSource", "ads_per_campaign", self.ads_per_campaign)
        if not isinstance(self.skew_ms, int) or self.skew_ms < 0:
            raise ConfigError(f"YahooSource: skew_ms must be an int >= 0, got {self.skew_ms!r}")
        if not isinstance(self.as_json, bool):
            raise ConfigError(f"YahooSource: as_json must be True or False, got {self.as_json!r}")
        if not isinstance(self.malformed_every, int) or self.malformed_every < 0:
            raise ConfigError(f"YahooSource: malformed_every must be an int >= 0, got {self.malformed_every!r}")
        if self.malformed_every and not self.as_json:
            raise ConfigError("YahooSource: malformed_every needs as_json=True (only JSON texts can be malformed)")

    def malformed(self, seq: np.ndarray) -> np.ndarray:
        """Which of the events ``seq`` are malformed JSON texts."""
        if not self.malformed_every:
            return np.zeros(len(seq), dtype=bool)
        return seq % self.malformed_every == self.malformed_every - 1

    @property
    def needs_python_driver(self) -> bool:
        return self.as_json or super().needs_python_driver

    @property
    def schema_ddl(self) -> str:
        if self.as_json:
            return "event string"
        return (
            "user_id string, page_id string, ad_id string, ad_type string, "
            "event_type string, event_time string, ip_address string"
        )

    @property
    def num_ads(self) -> int:
        return self.campaigns * self.ads_per_campaign

    @functools.cached_property
    def ids(self) -> dict[str, list[str]]:
        """Deterministic UUID strings for campaigns, ads, users and pages."""
        rng = random.Random(f"yahoo-ids-{self.seed}")
        make = lambda n: [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]  # noqa: E731
        return {
            "campaigns": make(self.campaigns),
            "ads": make(self.num_ads),
            "users": make(100),
            "pages": make(100),
        }

    def campaign_table(self) -> list[tuple[str, str]]:
        """The ad -> campaign mapping, ``[(ad_id, campaign_id), ...]``."""
        ids = self.ids
        return [(ad, ids["campaigns"][i // self.ads_per_campaign]) for i, ad in enumerate(ids["ads"])]

    # Field derivation shared (in meaning) with the SQL compilation:
    #   h = xxhash64(seq, seed)
    #   ad = pmod(h, ads); event_type = pmod(h >> 10, 3); user = pmod(h >> 20, 100)
    #   page = pmod(h >> 30, 100); ad_type = pmod(h >> 40, 5)
    #   event_time = start + seq*1000 // eps + (pmod(h >> 48, 2*skew+1) - skew)
    def reference(self, start: int, end: int, start_ms: int) -> dict[str, np.ndarray]:
        """Ad index, event type index and event time (ms) of ``seq`` in ``[start, end)``."""
        seq = self.seqs(start, end)
        h = self.hash(seq)
        t = self.event_time_ms(seq, start_ms)
        if self.skew_ms:
            t = t + (h >> 48) % (2 * self.skew_ms + 1) - self.skew_ms
        return {"ad": h % self.num_ads, "event_type": (h >> 10) % 3, "event_time": t, "malformed": self.malformed(seq)}

    def records(self, seq: np.ndarray, start_ms: int) -> list[dict[str, str]]:
        """The events of sequence numbers ``seq`` as records (what the Spark source emits)."""
        h = self.hash(seq)
        t = self.event_time_ms(seq, start_ms)
        if self.skew_ms:
            t = t + (h >> 48) % (2 * self.skew_ms + 1) - self.skew_ms
        ids = self.ids
        columns = {
            "user_id": np.array(ids["users"], dtype=object)[(h >> 20) % 100],
            "page_id": np.array(ids["pages"], dtype=object)[(h >> 30) % 100],
            "ad_id": np.array(ids["ads"], dtype=object)[h % self.num_ads],
            "ad_type": np.array(AD_TYPES, dtype=object)[(h >> 40) % 5],
            "event_type": np.array(EVENT_TYPES, dtype=object)[(h >> 10) % 3],
            "event_time": t.astype(str).astype(object),
        }
        names = list(columns)
        records = [dict(zip(names, values), ip_address="1.2.3.4") for values in zip(*columns.values())]
        if self.as_json:
            texts = [json.dumps(r, separators=(",", ":")) for r in records]
            return [{"event": t[:-1] if bad else t} for t, bad in zip(texts, self.malformed(seq).tolist())]
        return records

    def expected_window_counts(
        self, start: int, end: int, start_ms: int, size_ms: int
    ) -> dict[tuple[str, int], int]:
        """``{(campaign_id, window_start_ms): views}`` over ``seq`` in ``[start, end)``."""
        counts: dict[tuple[str, int], int] = {}
        camps = np.array(self.ids["campaigns"], dtype=object)
        chunk = 4_000_000
        for a in range(start, end, chunk):
            r = self.reference(a, min(end, a + chunk), start_ms)
            views = (r["event_type"] == 0) & ~r["malformed"]
            camp = r["ad"][views] // self.ads_per_campaign
            win = r["event_time"][views] // size_ms  # window index, < 2**32 until year 2106 for 1 s windows
            uniq, n = np.unique(camp * (1 << 32) + win, return_counts=True)
            for k, c in zip(uniq.tolist(), n.tolist()):
                ck = (camps[k >> 32], (k & 0xFFFFFFFF) * size_ms)
                counts[ck] = counts.get(ck, 0) + c
        return counts


# --------------------------------------------------------------------------- Grep (E1)
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["an", "en", "in", "on", "er", "st", "th", "ch"]


@functools.lru_cache(maxsize=1)
def dictionary_words(size: int = 127_000) -> tuple[str, ...]:
    """~127k distinct lowercase pseudo-English words, generated deterministically
    (no download). Rank order loosely follows length, as in English, tuned so
    sentences average ~53 characters as in the original benchmark."""
    rng = random.Random(20150805)
    words: set[str] = set()
    ordered: list[str] = []
    while len(ordered) < size:
        n = 2 + min(3, int(rng.expovariate(1.2)))
        w = "".join(rng.choice(_SYLLABLES) for _ in range(n))
        if w not in words:
            words.add(w)
            ordered.append(w)
    jitter = {w: rng.random() * 3 for w in ordered}
    ordered.sort(key=lambda w: len(w) + jitter[w])
    return tuple(ordered)


@dataclass(frozen=True)
class GrepSource(GeneratorSource):
    """Grep sentences (WORKLOADS.md E1): ``(sentence string, ts bigint)``.

    Each partition pre-builds ``sentences_per_partition`` sentences of 0-24
    words drawn Zipf(1.5) from a ~127k word dictionary, then cycles through them.
    """

    sentences_per_partition: int = 2000
    zipf_s: float = 1.5

    @property
    def schema_ddl(self) -> str:
        return "sentence string, ts bigint"

    def sentences(self, partition: int) -> list[str]:
        return _grep_sentences(self.seed, partition, self.sentences_per_partition, self.zipf_s)

    def all_sentences(self) -> list[str]:
        out: list[str] = []
        for p in range(self.partitions):
            out.extend(self.sentences(p))
        return out

    def expected_matches(self, pattern: str, start: int, end: int) -> int:
        """How many records with ``seq`` in ``[start, end)`` fully match ``pattern``."""
        rx = re.compile(pattern)
        n = self.sentences_per_partition
        total = 0
        for p in range(self.partitions):
            hits = np.array([rx.fullmatch(s) is not None for s in self.sentences(p)])
            if not hits.any():
                continue
            seq = self.seqs(start, end)
            seq = seq[seq % self.partitions == p]
            total += int(hits[(seq // self.partitions) % n].sum())
        return total


@functools.lru_cache(maxsize=64)
def _grep_sentences(seed: int, partition: int, count: int, s: float) -> list[str]:
    words = dictionary_words()
    rng = np.random.default_rng([seed, partition, 0x67726570])
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -s)
    cdf /= cdf[-1]
    out = []
    for _ in range(count):
        k = int(rng.integers(0, 25))
        idx = np.searchsorted(cdf, rng.random(k))
        out.append("".join(words[i] + " " for i in idx))
    return out


# --------------------------------------------------------------------------- Grouping (E2)
@dataclass(frozen=True)
class GroupingSource(GeneratorSource):
    """Stream record grouping (WORKLOADS.md E2): ``(seq_id bigint, host_id int, ts bigint, payload binary)``.

    ``ts`` is the record's ingestion wall-clock time (ms) on one record in
    ``sample_every`` (for latency percentiles) and 0 elsewhere. Under a target
    rate, ingestion time is the record's scheduled emission time (open loop);
    at unbounded speed it is the micro-batch start. With ``event_time=True``,
    ``ts`` is every record's event time instead (``start_ms + seq * 1000 //
    events_per_second``, in order), for event-time windows over these records.

    ``host_id`` is ``seq % hosts`` (round robin: every key equally often), or with
    ``skew`` Zipf-like (exponent ~1: key ``k`` about ``1/k`` as often as key 0, in
    integer arithmetic so Spark and :meth:`host_ids` agree exactly): a hash of ``seq``
    picks a level ``j`` uniformly among ``ceil(log2(hosts))`` and a key uniformly among
    the ``2**j`` keys ``2**j - 1 ... 2**(j+1) - 2`` (folded into ``hosts``).
    """

    hosts: int = 1000
    sample_every: int = 1000
    skew: bool = False
    event_time: bool = False

    @property
    def skew_levels(self) -> int:
        return max(1, (self.hosts - 1).bit_length())

    def host_ids(self, seq: np.ndarray) -> np.ndarray:
        """``host_id`` of each sequence number, as Spark computes it (translators/sources.py)."""
        seq = np.asarray(seq, dtype=np.int64)
        if not self.skew:
            return seq % self.hosts
        h = self.hash(seq)
        level = h % self.skew_levels
        width = np.left_shift(np.int64(1), level)
        return (width - 1 + (h >> 8) % width) % self.hosts

    def distinct_keys(self, events: int, chunk: int = 1 << 23) -> int:
        """How many distinct ``host_id`` the first ``events`` records hold."""
        if not self.skew:
            return min(self.hosts, events)
        seen = np.zeros(self.hosts, dtype=bool)
        for lo in range(0, events, chunk):
            seen[self.host_ids(np.arange(lo, min(events, lo + chunk), dtype=np.int64))] = True
        return int(seen.sum())

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("GroupingSource", "hosts", self.hosts)
        _positive_int("GroupingSource", "sample_every", self.sample_every)
        if not isinstance(self.event_time, bool):
            raise ConfigError(f"GroupingSource: event_time must be True or False, got {self.event_time!r}")

    @property
    def schema_ddl(self) -> str:
        return "seq_id bigint, host_id int, ts bigint, payload binary"


# --------------------------------------------------------------------------- Impressions and clicks (interval join)
@dataclass(frozen=True)
class AdClickSource(GeneratorSource):
    """Ad impressions, or the clicks on them, for an interval join (issue 17's benchmark).

    ``side="impressions"``: record ``i`` is ``(impression_id = i, ad_id, ts)``, ``ts`` the
    generator's event time of ``i`` (in order). ``side="clicks"``: record ``j`` is a click on
    impression ``j * click_every`` — ``(click_id = j, impression_id, ts)`` with ``ts`` that
    impression's time plus a delay in ``[0, max_delay_ms)`` (out of order by up to that).
    Give both sides the same ``seed``, ``nominal_rate`` and ``start_ms``, and the clicks a
    per-batch bound ``click_every`` times smaller: each micro-batch then reads the clicks of
    its own impressions, and every click has its impression within ``max_delay_ms`` before it.
    """

    side: str = "impressions"
    click_every: int = 10
    max_delay_ms: int = 10_000
    ads: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.side not in ("impressions", "clicks"):
            raise ConfigError(f"AdClickSource: side must be 'impressions' or 'clicks', got {self.side!r}")
        for what in ("click_every", "max_delay_ms", "ads"):
            _positive_int("AdClickSource", what, getattr(self, what))

    @property
    def schema_ddl(self) -> str:
        if self.side == "impressions":
            return "impression_id bigint, ad_id int, ts bigint"
        return "click_id bigint, impression_id bigint, ts bigint"

    def expected_pairs(self, impressions: int, clicks: int) -> tuple[int, int]:
        """``(pairs, sum of their impression ids)`` an interval join ``[0, max_delay_ms]`` on
        ``impression_id`` emits once the first ``impressions`` and ``clicks`` records were read."""
        matched = min(clicks, -(-impressions // self.click_every))  # clicks j with j * click_every < impressions
        return matched, self.click_every * matched * (matched - 1) // 2


# --------------------------------------------------------------------------- Rules (broadcast state)
@dataclass(frozen=True)
class RuleSource(GeneratorSource):
    """Rules that change every second of event time, for a broadcast-state benchmark:
    ``(ts bigint, second bigint, mask int)`` — from absolute second ``second`` (epoch s) on,
    report the event types whose bit is set in ``mask`` (``mask_of``).

    It walks the same sequence numbers as the events it governs — give it the events
    source's ``rate``, ``partitions``, ``nominal_rate``, per-batch bound and ``start_ms`` — and
    keeps the first of every second, so it advances in event time with them, batch by batch:
    the record at second ``k`` after the origin (``ts = start + k s``) publishes the rule of
    second ``k + lead_s``, the first one those of seconds ``0..lead_s`` too. A rule thus
    arrives ``lead_s`` seconds of event time before the events it governs.
    """

    lead_s: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("RuleSource", "lead_s", self.lead_s)

    @property
    def schema_ddl(self) -> str:
        return "ts bigint, second bigint, mask int"

    def mask_of(self, k: np.ndarray) -> np.ndarray:
        """The mask of the rule for second ``k`` after the origin (Spark's ``pmod(xxhash64(k, seed), 128)``)."""
        return np.mod(spark_xxhash64(k.astype(np.int64), np.full(len(k), self.seed, dtype=np.int64)), 128)


# --------------------------------------------------------------------------- State machine (E4)
# Event types 1..7 stand for a..g. Transitions: state -> {event: next state}.
STATE_NAMES = ("Initial", "W", "X", "Y", "Z", "Terminal")
TRANSITIONS: dict[int, dict[int, int]] = {
    0: {1: 1, 3: 2},  # Initial: a -> W, c -> X
    1: {2: 3},  # W: b -> Y
    2: {2: 3, 4: 4},  # X: b -> Y, d -> Z
    3: {5: 4},  # Y: e -> Z
    4: {7: 5},  # Z: g -> Terminal
}
# Valid sequences and their probabilities (WORKLOADS.md E4).
_SEQUENCES = ((1, 2, 5, 7), (3, 2, 5, 7), (3, 4, 7))  # abeg, cbeg, cdg
_SEQUENCE_P = (0.6, 0.08, 0.32)
_INVALID_FROM_INITIAL = np.array([2, 4, 5, 6, 7], dtype=np.int8)  # b d e f g


@dataclass(frozen=True)
class StateMachineSource(GeneratorSource):
    """State-machine events (WORKLOADS.md E4): ``(address int, type tinyint, ts bigint)``.

    Each partition owns the address range ``[p * 2**21, (p+1) * 2**21)`` and keeps
    ``active_addresses`` sequences interleaved, per-address order preserved.
    Events come in fixed-size *epochs* of ``frames_per_epoch`` sequences per
    active slot, with exact proportions of abeg / cbeg / cdg and of injected
    invalid events (``invalid_rate`` of the sequences), so any offset range is
    computable without replaying from the start. An injected invalid event is
    a single event, invalid from ``Initial``, on a fresh address: it causes
    exactly one alert ``(address, "Initial", type)``.
    """

    active_addresses: int = 1000
    frames_per_epoch: int = 100
    invalid_rate: float = 0.0001

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("StateMachineSource", "active_addresses", self.active_addresses)
        _positive_int("StateMachineSource", "frames_per_epoch", self.frames_per_epoch)
        if not (0.0 <= self.invalid_rate < 1.0):
            raise ConfigError(f"StateMachineSource: invalid_rate must be in [0, 1), got {self.invalid_rate!r}")
        if self.active_addresses * 1000 > 2**21:
            raise ConfigError("StateMachineSource: active_addresses must be <= 2097")

    @property
    def needs_python_driver(self) -> bool:
        return True

    @property
    def schema_ddl(self) -> str:
        return "address int, type tinyint, ts bigint"

    @functools.cached_property
    def _frame_counts(self) -> tuple[int, int, int, int]:
        frames = self.active_addresses * self.frames_per_epoch
        invalid = int(round(self.invalid_rate * frames))
        valid = frames - invalid
        abeg = int(round(_SEQUENCE_P[0] * valid))
        cbeg = int(round(_SEQUENCE_P[1] * valid))
        return abeg, cbeg, valid - abeg - cbeg, invalid

    @property
    def events_per_epoch(self) -> int:
        abeg, cbeg, cdg, invalid = self._frame_counts
        return 4 * abeg + 4 * cbeg + 3 * cdg + invalid

    @functools.lru_cache(maxsize=4)  # noqa: B019 - frozen, hashable; readers ask for one epoch many times
    def _epoch(self, partition: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Addresses, types and an is-injected flag of all events of one epoch, in order."""
        k, f = self.active_addresses, self.frames_per_epoch
        abeg, cbeg, cdg, invalid = self._frame_counts
        counts = np.repeat(np.arange(4, dtype=np.int8), [abeg, cbeg, cdg, invalid])
        rng = np.random.default_rng([self.seed, partition, epoch, 0x5EED])
        kinds = rng.permutation(counts).reshape(f, k)  # [frame, slot]
        bad = _INVALID_FROM_INITIAL[rng.integers(0, len(_INVALID_FROM_INITIAL), size=(f, k))]
        table = np.zeros((4, 4), dtype=np.int8)  # [kind, position] -> type (0 = no event)
        for i, seq in enumerate(_SEQUENCES):
            table[i, : len(seq)] = seq
        types = table[kinds]  # [frame, slot, pos]
        types[..., 0] = np.where(kinds == 3, bad, types[..., 0])
        frame_global = epoch * f + np.arange(f)
        addr = (
            partition * 2**21
            + ((frame_global % 1000)[:, None] * k)
            + np.arange(k)[None, :]
        ).astype(np.int32)  # [frame, slot]
        # Interleave: frame by frame, position by position, across all slots.
        types = types.transpose(0, 2, 1)  # [frame, pos, slot]
        addrs = np.broadcast_to(addr[:, None, :], types.shape)
        injected = np.broadcast_to((kinds == 3)[:, None, :], types.shape)
        keep = types > 0
        return addrs[keep], types[keep], injected[keep]

    def events(self, partition: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(address, type, injected)`` of partition offsets ``[start, end)``."""
        e = self.events_per_epoch
        parts = []
        for epoch in range(start // e, (end - 1) // e + 1 if end > start else start // e):
            a, t, inj = self._epoch(partition, epoch)
            lo = max(start - epoch * e, 0)
            hi = min(end - epoch * e, e)
            parts.append((a[lo:hi], t[lo:hi], inj[lo:hi]))
        if not parts:
            empty = np.array([], dtype=np.int32)
            return empty, empty.astype(np.int8), empty.astype(bool)
        return tuple(np.concatenate(x) for x in zip(*parts))  # type: ignore[return-value]

    def expected_alert_events(self, total_events: int, origin_ms: int) -> list[tuple[int, int, int]]:
        """``(address, type, event time ms)`` of every injected event among the first
        ``total_events`` (each causes one alert), for a job whose event-time origin is ``origin_ms``."""
        out: list[tuple[int, int, int]] = []
        eps = int(self.events_per_second)
        for p in range(self.partitions):
            n = len(range(p, total_events, self.partitions))
            addr, types, inj = self.events(p, 0, n)
            seq = np.nonzero(inj)[0].astype(np.int64) * self.partitions + p
            ts = origin_ms + (seq * 1000) // eps
            out.extend((int(a), int(t), int(x)) for a, t, x in zip(addr[inj], types[inj], ts))
        return sorted(out)

    def expected_alerts(self, total_events: int) -> list[tuple[int, str, int]]:
        """``(address, state, type)`` of every alert the first ``total_events`` events cause."""
        out: list[tuple[int, str, int]] = []
        for p in range(self.partitions):
            n = len(range(p, total_events, self.partitions))
            addr, types, inj = self.events(p, 0, n)
            out.extend((int(a), "Initial", int(t)) for a, t in zip(addr[inj], types[inj]))
        return sorted(out)
