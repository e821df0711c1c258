"""Resident memory of a job: this process and everything it started (Spark's JVM,
its Python workers), sampled from ``/proc`` while the job runs."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = ["tree_rss_bytes", "tree_pids", "RssSampler"]


def tree_rss_bytes(root: int, anonymous: bool = False) -> int:
    """Resident memory of ``root`` and all its descendants, in bytes (0 without /proc).
    ``anonymous``: only the processes' own memory (``RssAnon``: heaps, stacks), without the
    pages of files they map — the delta layout's working copies are memory-mapped files,
    whose pages the kernel can drop and reread (and which count once per process mapping
    them in the plain figure)."""
    return sum(_resident(pid)[1 if anonymous else 0] for pid in tree_pids(root))


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants (just ``root`` without /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [root]
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _resident(pid: int) -> tuple[int, int]:
    """A process's resident bytes: all (``VmRSS``) and anonymous (``RssAnon``); 0s once gone."""
    found = {"VmRSS:": 0, "RssAnon:": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name = line.split(":", 1)[0] + ":"
                if name in found:
                    found[name] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found["VmRSS:"], found["RssAnon:"]


def _kind(pid: int) -> str:
    """``"java"`` (Spark's JVM, RocksDB included), ``"python"`` (the driver, Python workers) or ``"other"``."""
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return "other"
    return next((k for k in ("java", "python") if k in name), "other")


class RssSampler:
    """Samples this process tree's RSS every 0.1 s while a job runs: ``warm`` = the RSS
    once ``warm_batches`` batches with input are done (JVM heap grown, Python workers
    started), ``peak`` = the highest after that, ``peak_any`` = the highest at all.
    Pass ``progress.append`` as the job's progress callback, with ``progress`` = this
    sampler's list (or leave it empty and use ``peak_any``)."""

    def __init__(self, warm_batches: int = 3) -> None:
        self.progress: list[dict[str, Any]] = []
        self.warm = self.peak = self.peak_any = 0
        self.peak_anonymous = 0  # the highest RssAnon (tree_rss_bytes(anonymous=True)) at all
        self.peak_anonymous_by_kind = {"java": 0, "python": 0}  # the same, of the JVM and of the Python processes
        self._warm_batches = warm_batches
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, anonymous = 0, 0  # one walk of the process tree per sample, one file per process
            by_kind = dict.fromkeys(self.peak_anonymous_by_kind, 0)
            for pid in tree_pids(os.getpid()):
                total, anon = _resident(pid)
                rss, anonymous = rss + total, anonymous + anon
                kind = _kind(pid)
                if kind in by_kind:
                    by_kind[kind] += anon
            self.peak_any = max(self.peak_any, rss)
            self.peak_anonymous = max(self.peak_anonymous, anonymous)
            for k, v in by_kind.items():
                self.peak_anonymous_by_kind[k] = max(self.peak_anonymous_by_kind[k], v)
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
