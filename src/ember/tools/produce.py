"""``ember produce``: generator events into Redis streams at a target rate.

The way the Yahoo benchmark's generator wrote into Kafka: open loop (event
``seq`` is due at ``start + seq / rate``), one stream per partition
(``<prefix>:<p>``), partition ``p`` holding the events ``seq % P == p`` in
order. The run's description — workload, seed, origin, events written — is
kept in the hash ``<prefix>:meta`` so a checker can recompute the ground
truth (alerts the state machine must raise, Yahoo window counts).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ember.connectors.external import redis_url
from ember.connectors.generators import StateMachineSource, YahooSource
from ember.errors import ConfigError
from ember.runner.spark.generator_batches import partition_offsets

__all__ = ["ProduceConfig", "ProduceReport", "produce", "stream_names", "WORKLOADS", "read_meta"]

WORKLOADS = ("statemachine", "yahoo")
STATEMACHINE_SCHEMA = "address int not null, type tinyint not null, ts bigint not null"
YAHOO_SCHEMA = "event string not null"  # one JSON document per entry, as from a broker


@dataclass(frozen=True)
class ProduceConfig:
    workload: str
    url: str | None = None
    prefix: str | None = None
    partitions: int = 2
    rate: float | None = 50_000.0  # events/s; None: as fast as possible
    events: int | None = None
    duration_s: float | None = None
    seed: int = 1
    invalid_rate: float = 0.001  # statemachine: share of sequences that are injected invalid events
    chunk: int = 2_000

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ConfigError(f"produce: workload must be one of {', '.join(WORKLOADS)}, got {self.workload!r}")
        if self.events is None and self.duration_s is None:
            raise ConfigError("produce: give events, duration, or both")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError(f"produce: rate must be > 0 events/s, got {self.rate!r}")
        if self.duration_s is not None and self.rate is None and self.events is None:
            raise ConfigError("produce: a duration needs a rate (or a number of events)")
        if not isinstance(self.partitions, int) or self.partitions <= 0:
            raise ConfigError(f"produce: partitions must be a positive int, got {self.partitions!r}")

    @property
    def stream_prefix(self) -> str:
        return self.prefix or f"ember:{self.workload}"

    @property
    def total(self) -> int:
        caps = [self.events] if self.events is not None else []
        if self.duration_s is not None and self.rate is not None:
            caps.append(int(self.duration_s * self.rate))
        return min(caps)

    def source(self) -> StateMachineSource | YahooSource:
        if self.workload == "statemachine":
            # Event time advances at the production rate (as fast as possible: the generator's nominal
            # rate), so event-time windows downstream close as wall time passes.
            return StateMachineSource(partitions=self.partitions, seed=self.seed, invalid_rate=self.invalid_rate,
                                      nominal_rate=max(1, int(self.rate)) if self.rate else 1_000_000)
        return YahooSource(partitions=self.partitions, seed=self.seed)


@dataclass(frozen=True)
class ProduceReport:
    events: int
    seconds: float
    streams: list[str]
    origin_ms: int

    @property
    def rate(self) -> float:
        return self.events / max(self.seconds, 1e-9)


def stream_names(prefix: str, partitions: int) -> list[str]:
    return [f"{prefix}:{p}" for p in range(partitions)]


def read_meta(client: Any, prefix: str) -> dict[str, Any]:
    raw = client.hgetall(f"{prefix}:meta")
    return {k.decode(): json.loads(v) for k, v in raw.items()}


def produce(
    cfg: ProduceConfig,
    *,
    stop: threading.Event | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> ProduceReport:
    """Writes ``cfg.total`` events (fewer if ``stop`` is set) and returns what was written."""
    import redis

    client = redis.Redis.from_url(redis_url(cfg.url))
    client.ping()
    source = cfg.source()
    streams = stream_names(cfg.stream_prefix, cfg.partitions)
    origin = time.time_ns() // 1_000_000
    meta_key = f"{cfg.stream_prefix}:meta"
    client.delete(meta_key, *streams)
    meta = {"workload": cfg.workload, "seed": cfg.seed, "partitions": cfg.partitions, "origin_ms": origin,
            "invalid_rate": cfg.invalid_rate, "events": 0, "done": False}
    client.hset(meta_key, mapping={k: json.dumps(v) for k, v in meta.items()})
    encode: Callable[..., Any] = _statemachine_fields if cfg.workload == "statemachine" else _yahoo_fields
    total, n = cfg.total, 0
    least = 1 if cfg.rate is None else max(1, int(cfg.rate * 0.02))  # write every ~20 ms, not per event
    start = time.monotonic()
    last_report = start
    while n < total and not (stop is not None and stop.is_set()):
        due = total if cfg.rate is None else min(total, int((time.monotonic() - start) * cfg.rate))
        if due - n < min(least, total - n):
            time.sleep(0.005)
            continue
        hi = min(due, n + cfg.chunk)
        pipe = client.pipeline(transaction=False)
        for p, stream in enumerate(streams):
            a, b = partition_offsets(p, cfg.partitions, n, hi)
            for fields in encode(source, p, a, b, origin):
                pipe.xadd(stream, fields)
        pipe.hset(meta_key, "events", str(hi))
        pipe.execute()
        n = hi
        if progress is not None and time.monotonic() - last_report >= 1.0:
            last_report = time.monotonic()
            progress(n, last_report - start)
    client.hset(meta_key, mapping={"events": n, "done": "true"})
    return ProduceReport(n, time.monotonic() - start, streams, origin)


def _statemachine_fields(source: StateMachineSource, p: int, a: int, b: int, origin: int) -> Any:
    if b <= a:
        return
    addr, types, _ = source.events(p, a, b)
    seq = np.arange(a, b, dtype=np.int64) * source.partitions + p
    ts = origin + (seq * 1000) // int(source.events_per_second)
    for x, t, s in zip(addr.tolist(), types.tolist(), ts.tolist()):
        yield {"address": x, "type": t, "ts": s}


def _yahoo_fields(source: YahooSource, p: int, a: int, b: int, origin: int) -> Any:
    if b <= a:
        return
    seq = np.arange(a, b, dtype=np.int64) * source.partitions + p
    for record in source.records(seq, origin):
        yield {"event": json.dumps(record, separators=(",", ":"))}


def main_produce(cfg: ProduceConfig, as_json: bool) -> ProduceReport:
    """The CLI: produce with a progress line per second on stderr."""

    def show(n: int, elapsed: float) -> None:
        print(f"[ember produce] {n:,} / {cfg.total:,} events, {n / max(elapsed, 1e-9):,.0f} events/s", file=sys.stderr, flush=True)

    report = produce(cfg, progress=None if as_json else show)
    if as_json:
        print(json.dumps({"events": report.events, "seconds": round(report.seconds, 3), "rate": round(report.rate),
                          "streams": report.streams, "origin_ms": report.origin_ms}))
    else:
        print(f"produced {report.events:,} {cfg.workload} events into {', '.join(report.streams)} "
              f"in {report.seconds:.1f} s ({report.rate:,.0f} events/s)")
    return report
