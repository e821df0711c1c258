"""ember.runner.spark.worker_gc: PySpark's daemon collects only the young generations after a
task in Spark's Python workers (the whole heap every FULL_EVERY tasks), nowhere else."""

from __future__ import annotations

import gc
import types
import weakref
from importlib.machinery import ModuleSpec

import pytest

from ember.runner.spark import worker_gc
from ember.runner.spark.worker_gc import KEEP_FULL, AfterTaskCollector, install


def _main(name: str = "pyspark.daemon", holds=gc) -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__spec__ = ModuleSpec(name, None)
    main.gc = holds
    return main


def test_the_daemon_of_a_worker_gets_the_young_collector(monkeypatch):
    monkeypatch.delenv(KEEP_FULL, raising=False)
    main = _main()
    assert install(main) is True
    assert isinstance(main.gc, AfterTaskCollector)
    assert main.gc.get_threshold() == gc.get_threshold()  # everything else is the real module's


@pytest.mark.parametrize("main", [_main("pyspark.worker"), _main(holds=object()), types.ModuleType("__main__")],
                         ids=["another module", "no gc module", "not run with -m"])
def test_nothing_else_is_patched(monkeypatch, main):
    monkeypatch.delenv(KEEP_FULL, raising=False)
    before = getattr(main, "gc", None)
    assert install(main) is False
    assert getattr(main, "gc", None) is before


def test_the_full_collection_is_kept_when_asked(monkeypatch):
    monkeypatch.setenv(KEEP_FULL, "full")
    main = _main()
    assert install(main) is False and main.gc is gc


def test_after_a_task_the_young_generations_and_every_nth_time_the_whole_heap(monkeypatch):
    generations: list[int] = []
    monkeypatch.setattr(worker_gc, "gc", types.SimpleNamespace(collect=lambda g=2: generations.append(g) or 0))
    collector = AfterTaskCollector(full_every=3)
    for _ in range(7):
        collector.collect()
    collector.collect(0)
    assert generations == [1, 1, 2, 1, 1, 2, 1, 0]


def test_a_young_collection_frees_what_a_task_left_in_a_cycle():
    class Node:
        pass

    gc.collect()
    gc.disable()  # (no automatic collection between the asserts)
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        alive = weakref.ref(a)
        del a, b
        assert alive() is not None  # a cycle: reference counting alone cannot free it
        AfterTaskCollector().collect()
        assert alive() is None
    finally:
        gc.enable()
