"""Design B of keyed state (keyed/delta.py) without Spark: the log, its version and the
working copy on disk against a plain dict, across rebuilds, replays and compactions."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from bucket_driver import ListState, ValueState

from ember.errors import UserFunctionError
from ember.runner.spark.keyed import delta
from ember.runner.spark.keyed.delta import DeltaLog, LocalTable, Version, decode_part, delta_layout_problem, fold_parts
from ember.runner.spark.keyed.vectorized import DeltaTable

TYPES = [np.int64, np.float64]
FIELDS = ["count", "total"]


class Store:
    """A bucket's Spark-side state with commit/abort, as Spark's state store behaves for a
    batch that commits or is replayed."""

    def __init__(self) -> None:
        self.parts, self.version = ListState(), ValueState()
        self.overflow: dict = {}  # a process function's overflow, kept in its bucket blob beside the log
        self._saved = ([], None)
        self.last: DeltaLog | None = None

    def new_log(self, table, bucket: int, fields: list[str]) -> DeltaLog:
        """A call's log of this bucket; the previous call ended first (as Spark's calls of a
        bucket never overlap: it releases the copy's lock)."""
        if self.last is not None:
            self.last.close()
        self.last = DeltaLog(self.parts, self.version, table, bucket, fields)
        return self.last

    def commit(self) -> None:
        self._saved = (list(self.parts.items), self.version.value)

    def abort(self) -> None:
        self.parts.items, self.version.value = list(self._saved[0]), self._saved[1]


def run_batch(store: Store, directory: str, changes: dict[int, tuple[int, float] | None], bucket: int = 0) -> DeltaLog:
    log = store.new_log(LocalTable(directory, TYPES), bucket, FIELDS)
    log.open()
    keys = np.array(sorted(changes), dtype=np.int64)
    deleted = np.array([changes[k] is None for k in keys], bool)
    count = np.array([0 if changes[k] is None else changes[k][0] for k in keys], np.int64)
    total = np.array([0.0 if changes[k] is None else changes[k][1] for k in keys], np.float64)
    log.write(keys, [count, total], deleted)
    return log


def table_of(log: DeltaLog) -> dict[int, tuple[int, float]]:
    keys, (count, total) = log.read(np.asarray(log.local.keys, dtype=np.int64))
    return {int(k): (int(c), float(t)) for k, c, t in zip(keys, count, total)}


def random_changes(rng: np.random.Generator, model: dict[int, tuple[int, float]], space: int, n: int) -> dict[int, tuple[int, float] | None]:
    changes: dict[int, tuple[int, float] | None] = {}
    for k in rng.integers(0, space, n).tolist():
        if k in model and rng.random() < 0.15:
            changes[k] = None
        else:
            changes[k] = (int(rng.integers(0, 1000)), float(rng.random()))
    return changes


def apply_model(model: dict, changes: dict) -> None:
    for k, v in changes.items():
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v


def test_the_copy_follows_a_model_across_batches_rebuilds_and_compactions(tmp_path):
    rng = np.random.default_rng(7)
    store, model = Store(), {}
    directory = str(tmp_path / "b0")
    compacted = False
    for batch in range(60):
        changes = random_changes(rng, model, 3000, 400)
        log = run_batch(store, directory, changes)
        store.commit()
        apply_model(model, changes)
        assert table_of(log) == model
        assert Version.of(store.version.value).live == len(model)
        compacted = compacted or bool(store.parts.puts)
        if batch % 17 == 16:  # the copy lost (another executor, a cleaned temp dir): rebuilt from the log
            import shutil

            shutil.rmtree(directory)
    assert compacted, "the log was never compacted: the test does not cover compaction"
    keys, columns = fold_parts((p[0] for p in store.parts.items), FIELDS, TYPES)
    assert dict(zip(keys.tolist(), zip(columns[0].tolist(), columns[1].tolist()))) == model


def test_a_replayed_batch_rebuilds_the_copy_that_ran_ahead(tmp_path):
    store, directory = Store(), str(tmp_path / "b")
    run_batch(store, directory, {1: (1, 1.0), 2: (2, 2.0)})
    store.commit()
    run_batch(store, directory, {1: (10, 10.0), 3: (3, 3.0)})  # its commit never happens (driver killed)
    store.abort()
    log = store.new_log(LocalTable(directory, TYPES), 0, FIELDS)
    log.open()
    assert log.rebuilt_rows == 2  # the copy said batch 2, the store batch 1
    assert table_of(log) == {1: (1, 1.0), 2: (2, 2.0)}
    log.close()
    log = run_batch(store, directory, {1: (10, 10.0), 3: (3, 3.0)})  # the replay
    store.commit()
    assert table_of(log) == {1: (10, 10.0), 2: (2, 2.0), 3: (3, 3.0)}


def test_a_current_copy_is_not_rebuilt(tmp_path):
    store, directory = Store(), str(tmp_path / "b")
    run_batch(store, directory, {1: (1, 1.0)})
    store.commit()
    log = store.new_log(LocalTable(directory, TYPES), 0, FIELDS)
    log.open()
    assert log.rebuilt_rows == -1


def test_two_attempts_of_a_bucket_at_once_do_not_share_its_copy(tmp_path):
    """A zombie or speculative attempt overlapping the real one: the second works on a
    private copy rebuilt from the log (removed after), so the shared copy holds exactly the
    attempt that commits. Without the lock both write the shared copy, and the committed
    attempt's tag would vouch for the other's rows too."""
    store, directory = Store(), str(tmp_path / "b")
    run_batch(store, directory, {1: (1, 1.0), 2: (2, 2.0)})
    store.commit()
    store.last.close()
    other = Store()  # the other attempt reads the same committed state; its writes are never committed
    other.parts.items, other.version.value = list(store.parts.items), store.version.value
    first = store.new_log(LocalTable(directory, TYPES), 0, FIELDS)
    first.open()
    second = other.new_log(LocalTable(directory, TYPES), 0, FIELDS)
    second.open()
    assert second.local.dir != directory and second.rebuilt_rows == 2
    second.write(np.array([2, 9], np.int64), [np.array([20, 90]), np.array([20.0, 90.0])], np.zeros(2, bool))
    first.write(np.array([1], np.int64), [np.array([10]), np.array([10.0])], np.zeros(1, bool))
    store.commit()
    private = second.local.dir
    second.close()
    first.close()
    assert not os.path.exists(private)
    log = store.new_log(LocalTable(directory, TYPES), 0, FIELDS)
    log.open()
    assert log.rebuilt_rows == -1  # the shared copy is the committed attempt's
    assert table_of(log) == {1: (10, 10.0), 2: (2, 2.0)}


def test_a_copy_from_another_boot_or_cut_short_is_not_trusted(tmp_path, monkeypatch):
    store, directory = Store(), str(tmp_path / "b")
    run_batch(store, directory, {1: (1, 1.0)})
    store.commit()
    monkeypatch.setattr(delta, "BOOT_ID", "another-boot")
    assert LocalTable(directory, TYPES).tag() is None
    monkeypatch.undo()
    table = LocalTable(directory, TYPES)
    table._set_tag("dirty")  # what a write does first: a copy cut short mid-write has no tag
    assert table.tag() is None


def test_only_changed_rows_are_appended(tmp_path):
    store, directory = Store(), str(tmp_path / "b")
    run_batch(store, directory, {k: (k, 0.5) for k in range(50_000)})
    store.commit()
    run_batch(store, directory, {k: (k + 1, 0.5) for k in range(0, 50_000, 50)})  # 1,000 of 50,000 keys
    store.commit()
    assert store.parts.appends[-1] < 40 * 1000  # ~17 bytes a row (key, two fields, flag) plus a header
    assert decode_part(store.parts.items[-1][0]).num_rows == 1000


def test_compaction_keeps_checkpoint_volume_near_the_changed_rows(tmp_path):
    """Over many batches that each rewrite a fifth of the keys, appends plus compactions stay
    within 1.5x what was appended (issue 18's bound), and the log stays bounded."""
    store, directory = Store(), str(tmp_path / "b")
    rng = np.random.default_rng(3)
    run_batch(store, directory, {k: (1, 1.0) for k in range(20_000)})
    store.commit()
    first = sum(store.parts.appends)
    for _ in range(40):
        run_batch(store, directory, {int(k): (2, 2.0) for k in rng.integers(0, 20_000, 4000)})
        store.commit()
    appended = sum(store.parts.appends) - first
    assert store.parts.puts, "no compaction happened"
    assert (appended + sum(store.parts.puts)) / appended <= 1.5
    assert Version.of(store.version.value).logged <= (delta.COMPACT_FACTOR + 1) * 20_000


def test_delta_table_reads_and_writes_frames(tmp_path):
    store = Store()
    log = store.new_log(LocalTable(str(tmp_path / "b"), TYPES), 0, FIELDS)
    log.open()
    table = DeltaTable(log, "k", FIELDS, TYPES, "count")
    assert table.current(pd.Index([1, 2])).empty
    table.update(pd.DataFrame({"count": [5, 7], "total": [0.5, 0.7]}, index=pd.Index([2, 1])))
    got = table.current(pd.Index([1, 2, 3]))
    assert got.to_dict("index") == {1: {"count": 7, "total": 0.7}, 2: {"count": 5, "total": 0.5}}
    table.update(pd.DataFrame({"count": [None], "total": [None]}, index=pd.Index([1])))  # all null: deleted
    assert list(table.current(pd.Index([1, 2])).index) == [2]
    with pytest.raises(UserFunctionError, match="state field 'count' is null for key 2"):
        table.update(pd.DataFrame({"count": [None], "total": [1.0]}, index=pd.Index([2])))


def test_which_steps_the_layout_takes():
    assert delta_layout_problem(["bigint"], ["bigint", "double", "boolean"]) is None
    assert "one integer field" in delta_layout_problem(["string"], ["bigint"])
    assert "one integer field" in delta_layout_problem(["int", "int"], ["bigint"])
    assert "numbers or booleans" in delta_layout_problem(["int"], ["string"])


# -- a process function's slots (SlotTable, DeltaKeys) --------------------------------------

def slot_call(store: Store, directory: str, reads: list[int], change) -> delta.DeltaKeys:
    """One call of a bucket: prefetch ``reads``, let ``change(table)`` edit it as bucket.py
    does (slots changed in place, added, deleted), flush."""
    log = store.new_log(delta.SlotTable(directory), 0, ["slot"])
    log.open()
    table = delta.DeltaKeys(log, store.overflow)
    table.prefetch(reads)
    change(table)
    table.flush()
    log.close()
    return table


def edit(table: dict, plan: dict, batch: int, delete_below: float) -> None:
    """A call's edits as bucket.py makes them (slots changed in place, added, deleted), for
    each key by its draw in ``plan``; applied alike to a DeltaKeys table and to the model, a
    plain dict of the same slots."""
    for k, r in plan.items():
        slot = table.get(k)
        if r < delete_below:
            if slot is not None:
                del table[k]
        elif slot is None:
            table[k] = {"n": 1, "seen": [batch]}
        else:
            slot["n"] += 1  # in place, as state cells do
            slot["seen"].append(batch)


def read_all(store: Store, directory: str, keys) -> dict:
    log = store.new_log(delta.SlotTable(directory), 0, ["slot"])
    log.open()
    table = delta.DeltaKeys(log, store.overflow)
    table.prefetch(keys)
    out = {k: dict.__getitem__(table, k) for k in keys if dict.__contains__(table, k)}
    log.close()
    return out


def test_slots_follow_a_model_with_in_place_edits_deletions_rebuilds_and_heap_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(delta.SlotTable, "GARBAGE_MIN", 2000)  # the heap is rewritten within the test
    monkeypatch.setattr(delta, "COMPACT_MIN_ROWS", 100)  # and the log compacted
    rng = np.random.default_rng(5)
    store, model = Store(), {}
    directory = str(tmp_path / "slots")
    heap_rewritten, last_size = False, 0
    for batch in range(50):
        reads = [int(k) for k in rng.integers(0, 400, 60)]
        plan = {k: rng.random() for k in set(reads)}

        slot_call(store, directory, reads, lambda t, plan=plan, batch=batch: edit(t, plan, batch, 0.15))
        store.commit()
        edit(model, plan, batch, 0.15)
        assert read_all(store, directory, range(400)) == model
        size = (tmp_path / "slots" / "heap.bin").stat().st_size
        heap_rewritten = heap_rewritten or (size < last_size and batch - 1 not in (20, 35))  # appends only grow it
        last_size = size
        if batch in (20, 35):
            import shutil

            shutil.rmtree(directory)  # rebuilt from the log next call
    assert store.parts.puts, "the log was never compacted"
    assert heap_rewritten


def test_slots_a_call_that_changes_nothing_writes_nothing(tmp_path):
    store, directory = Store(), str(tmp_path / "s")
    slot_call(store, directory, [1, 2], lambda t: t.__setitem__(1, {"v": 1}))
    store.commit()
    appended = len(store.parts.appends)
    table = slot_call(store, directory, [1, 2, 3], lambda t: (t.get(1), t.get(2), t.get(3)))
    assert len(store.parts.appends) == appended
    assert table.changes()[0].tolist() == []


def test_slots_a_key_looked_up_one_by_one_is_loaded(tmp_path):
    """A timer's key is not among the frame's keys: get() loads it on its own."""
    store, directory = Store(), str(tmp_path / "s")
    slot_call(store, directory, [7], lambda t: t.__setitem__(7, {"timer": 5}))
    store.commit()
    got = {}
    slot_call(store, directory, [], lambda t: got.update(v=t.get(7), missing=t.get(8), has=7 in t))
    assert got == {"v": {"timer": 5}, "missing": None, "has": True}


# -- a process function on design B, driven like Spark drives it (bucket.py) ----------------

class DeltaGroupState:
    """Spark's side for one bucket on design B (keyed/tws.py _SlotState), without Spark."""

    def __init__(self, store: Store, meta: dict, directory: str, now: int) -> None:
        self.store, self.meta, self.now = store, meta, now
        self.log = store.new_log(delta.SlotTable(directory), 0, ["slot"])
        self.log.open()

    def load_blob(self):
        import pickle

        from ember.runner.spark.keyed.runtime import empty_bucket_state

        blob = pickle.loads(self.meta["blob"]) if "blob" in self.meta else empty_bucket_state()
        blob["keys"] = delta.DeltaKeys(self.log)
        return blob

    def store_blob(self, blob):
        import pickle

        blob["keys"].flush()
        self.meta["blob"] = pickle.dumps({**blob, "keys": {}})

    def getCurrentWatermarkMs(self):  # noqa: N802
        return 0

    def getCurrentProcessingTimeMs(self):  # noqa: N802
        return self.now

    def setTimeoutDuration(self, ms):  # noqa: N802
        pass


def test_ttl_state_of_keys_never_read_again_is_swept_from_disk(tmp_path, monkeypatch):
    """A dedupe whose keys each come once: with the blob layout every write expires them all;
    on design B the sweep visits a slice of the keys each call, so they leave the table and
    the log within SWEEP_SHARE calls of their expiry — and a live key is never dropped."""
    from ember.functions import KeyedProcessFunction
    from ember.runner.spark.keyed.bucket import BucketFunction
    from ember.state import StateTtlConfig, ValueStateDescriptor

    monkeypatch.setattr(delta.DeltaKeys, "SWEEP_MIN", 50)
    monkeypatch.setattr(delta.DeltaKeys, "SWEEP_SHARE", 4)

    class Seen(KeyedProcessFunction):
        def open(self, ctx):
            self.seen = ctx.get_state(ValueStateDescriptor("seen", ttl=StateTtlConfig.of(1000, "read_and_write")))

        def process_element(self, value, ctx):
            if self.seen.value() is None:
                self.seen.update(True)
                yield {"k": ctx.current_key}

    fn = BucketFunction(Seen(), "dedupe", ["k"], ["k"], ["k"], None, False)
    store, meta, directory = Store(), {}, str(tmp_path / "b")
    for call in range(12):
        now = call * 400  # each key expires 1,000 ms (2.5 calls) after its only record
        state = DeltaGroupState(store, meta, directory, now)
        keys = list(range(call * 100 + 10, call * 100 + 110)) + [7]  # key 7 read in every call: never expires
        out = list(fn(0, iter([pd.DataFrame({"k": keys})]), state))
        store.commit()
        seen = [k for frame in out for k in frame["k"].tolist()]
        assert 7 not in seen or call == 0
        state.log.close()
    live = Version.of(store.version.value).live
    remaining = np.load(os.path.join(directory, "keys.npy")).tolist()
    assert len(remaining) == live
    assert 7 in remaining
    # Keys of calls 0-4 (written by 1,600 ms, expired by 2,600) have had over 4 sweeps since:
    # none is left on disk; without the sweep all 1,201 keys would be (no record reads them again).
    assert [k for k in remaining if k < 510 and k != 7] == []
    assert live < 1201 - 500


@pytest.mark.parametrize("buckets_of_hash", [None, 3], ids=["real-hash", "colliding-hash"])
def test_keys_of_any_type_follow_a_model_even_when_their_hashes_collide(tmp_path, monkeypatch, buckets_of_hash):
    """String and tuple keys are indexed by a hash; with a hash forced to 3 values nearly every
    key collides, and each must still read and write its own state (the overflow)."""
    if buckets_of_hash is not None:
        real = delta.key_hashes
        monkeypatch.setattr(delta, "key_hashes", lambda keys: real(keys) % buckets_of_hash)
    rng = np.random.default_rng(9)
    names = [f"user-{i}" for i in range(30)] + [(i, "t") for i in range(10)]
    store, model = Store(), {}
    directory = str(tmp_path / "slots")
    for batch in range(40):
        reads = [names[int(i)] for i in rng.integers(0, len(names), 12)]
        plan = {k: rng.random() for k in reads}

        slot_call(store, directory, reads, lambda t, plan=plan, batch=batch: edit(t, plan, batch, 0.2))
        store.commit()
        edit(model, plan, batch, 0.2)
        if batch % 13 == 12:
            import shutil

            shutil.rmtree(directory)
        got = {}
        slot_call(store, directory, names, lambda t, got=got: got.update({k: dict(t[k]) for k in names if k in t}))
        store.commit()
        assert got == model, batch
    if buckets_of_hash is not None:
        assert store.overflow, "no key collided: the test does not test collisions"


def test_a_sweep_loads_collided_keys_so_their_changes_are_kept(tmp_path, monkeypatch):
    """The TTL sweep loads the overflow's keys too; what the call then does to them is stored."""
    real = delta.key_hashes
    monkeypatch.setattr(delta, "key_hashes", lambda keys: real(keys) % 1)  # every key collides
    store, directory = Store(), str(tmp_path / "s")
    slot_call(store, directory, ["a", "b", "c"], lambda t: [t.__setitem__(k, {"n": 1}) for k in ("a", "b", "c")])
    store.commit()
    assert len(store.overflow) == 2

    def expire_one_swept(table):
        table.sweep(0)
        swept = [k for k in dict.keys(table)]
        assert sorted(swept) == ["a", "b", "c"]
        owner = next(k for k in swept if k not in store.overflow)
        collided = next(k for k in swept if k in store.overflow)
        del table[collided]
        table[owner]["n"] = 2

    slot_call(store, directory, [], expire_one_swept)
    store.commit()
    got = {}
    slot_call(store, directory, ["a", "b", "c"], lambda t: got.update({k: dict(t[k]) for k in "abc" if k in t}))
    assert sorted(got.values(), key=str) == [{"n": 1}, {"n": 2}] and len(got) == 2


@pytest.mark.parametrize("collide", [False, True])
def test_apply_to_keyed_state_reaches_keys_no_record_of_the_call_read(tmp_path, monkeypatch, collide):
    """A broadcast element's ``apply_to_keyed_state`` visits every key of the bucket: on
    design B the table holds only the keys loaded so far, so it loads them all first (also
    the overflow's, when hashes collide). Without that, keys stored in earlier calls keep
    their state (the broadcast test on Spark caught it)."""
    from ember.coprocess import INPUT, field_column
    from ember.functions import KeyedBroadcastProcessFunction
    from ember.runner.spark.keyed.broadcast import BROADCAST_INPUT, FIRST, BroadcastAdapter
    from ember.runner.spark.keyed.runtime import KeyedRuntime, empty_bucket_state
    from ember.state.descriptors import MapStateDescriptor, ValueStateDescriptor

    if collide:
        real = delta.key_hashes
        monkeypatch.setattr(delta, "key_hashes", lambda keys: real(keys) % 1)
    seen = ValueStateDescriptor("seen", default=0)

    class Reset(KeyedBroadcastProcessFunction):
        def open(self, ctx):
            self.seen = ctx.get_state(seen)

        def process_broadcast_element(self, value, ctx):
            ctx.apply_to_keyed_state(seen, lambda key, state: state.update(state.value() * 100))
            return None

    store, directory = Store(), str(tmp_path / "s")
    slot_call(store, directory, ["a", "b", "c"], lambda t: [t.__setitem__(k, {"seen": n}) for n, k in enumerate("abc", 1)])
    store.commit()
    adapter = BroadcastAdapter(Reset(), ["k"], ["name"], (MapStateDescriptor("rules"),))

    def broadcast(table):
        rt = KeyedRuntime(event_time=False)
        rt.blob = {**empty_bucket_state(), "keys": table}
        adapter.open(rt)
        row = {INPUT: BROADCAST_INPUT, FIRST: True, field_column(1, "k"): None, field_column(2, "name"): "reset"}
        adapter.process_element(row, rt)

    slot_call(store, directory, [], broadcast)
    store.commit()
    got = {}
    slot_call(store, directory, ["a", "b", "c"], lambda t: got.update({k: t[k]["seen"] for k in "abc"}))
    assert got == {"a": 100, "b": 200, "c": 300}
