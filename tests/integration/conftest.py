"""Fixtures for tests on the real Redis and PostgreSQL servers of this machine
(EMBER_REDIS_URL, EMBER_POSTGRES_URL; a missing service fails, it does not skip)."""

import os
import threading
import time
import uuid

import psycopg
import pytest
import redis

from ember.connectors.external import postgres_url, redis_url


@pytest.fixture
def r():
    client = redis.Redis.from_url(redis_url())
    client.ping()
    return client


@pytest.fixture
def prefix(r):
    name = f"ember:test:{uuid.uuid4().hex[:8]}"
    yield name
    keys = list(r.scan_iter(f"{name}*"))
    if keys:
        r.delete(*keys)


@pytest.fixture
def table():
    name = f"ember_test_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(postgres_url(), autocommit=True) as conn:
        conn.execute(f'drop table if exists "{name}"')


def _tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants (the JVM, Spark's Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


class RssSampler:
    """Samples this process tree's RSS every 0.1 s while a job runs: ``warm`` = the RSS
    once ``warm_batches`` batches with input are done (JVM heap grown, Python workers
    started), ``peak`` = the highest after that. Pass ``progress.append`` as the job's
    progress callback, with ``progress`` = this sampler's list."""

    def __init__(self, warm_batches: int = 3) -> None:
        self.progress: list[dict] = []
        self.warm = self.peak = 0
        self._warm_batches = warm_batches
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = _tree_rss_bytes(os.getpid())
            if sum(1 for p in self.progress if p["numInputRows"]) >= self._warm_batches:
                self.warm = self.warm or rss
                self.peak = max(self.peak, rss)
            time.sleep(0.1)

    @property
    def growth(self) -> int:
        return self.peak - self.warm

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def rss_sampler():
    return RssSampler
