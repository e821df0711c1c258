"""The savepoint file format without Spark: what a cut keeps, and how damage is found."""

import json
import os

import pytest

from ember.runner.spark.restart import compare
from ember.savepoints.store import (
    MANIFEST,
    SavepointError,
    cut_checkpoint,
    delete_savepoint,
    list_savepoints,
    verify,
)


def _write(path, text="x"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture
def checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    for b in range(4):  # batch 3 planned, not committed
        _write(str(root / "offsets" / str(b)), f'v1\n{{"conf":{{"spark.sql.shuffle.partitions":"2"}}}}\n{{"n":{b}}}')
        _write(str(root / "offsets" / f".{b}.crc"))
    for b in range(3):
        _write(str(root / "commits" / str(b)), "v1\n{}")
    for v in range(1, 5):
        _write(str(root / "state" / "0" / "1" / f"{v}.changelog"), f"state {v}")
    _write(str(root / "state" / "0" / "1" / "SSTs" / "000008-abc.sst"), "sst")
    _write(str(root / "state" / "0" / "1" / "4.zip.tmp"), "uploading")
    _write(str(root / "state" / "0" / "_metadata" / "metadata"), "{}")
    _write(str(root / "metadata"), '{"id":"q"}')
    _write(str(root / "ember" / "pipeline.json"), "{}")
    _write(str(root / "ember" / "running"), '{"pid": 1}')
    _write(str(root / "ember" / "stop-request"))
    _write(str(root / "ember" / "quiet" / "w" / "7.2.run-a"), "")  # a quiet bucket's mark (keyed/reach.py)
    return str(root)


def test_cut_keeps_the_committed_batch_and_its_state_version_only(checkpoint, tmp_path):
    dest = str(tmp_path / "sp" / "one")
    manifest = cut_checkpoint(checkpoint, dest, {"job": "j"})
    files = set(manifest["files"])
    assert manifest["batch_id"] == 2 and manifest["partitions"] == 2 and manifest["job"] == "j"
    assert {f for f in files if f.startswith("offsets")} == {"offsets/0", "offsets/1", "offsets/2"}
    assert {f for f in files if f.startswith("commits")} == {"commits/0", "commits/1", "commits/2"}
    # state version = batch + 1: versions 1..3 are the cut's, 4 belongs to the uncommitted batch
    assert {f for f in files if f.endswith(".changelog")} == {f"state/0/1/{v}.changelog" for v in (1, 2, 3)}
    assert "state/0/1/SSTs/000008-abc.sst" in files and "state/0/_metadata/metadata" in files
    assert "ember/pipeline.json" in files and "ember/running" not in files and "ember/stop-request" not in files
    assert not any(f.startswith("ember/quiet") for f in files)  # one run's marks, never restored
    assert not any(f.endswith((".crc", ".tmp")) for f in files)
    assert verify(dest)["batch_id"] == 2
    assert [s.path for s in list_savepoints(str(tmp_path / "sp"))] == [dest]
    with pytest.raises(SavepointError, match="already exists"):
        cut_checkpoint(checkpoint, dest, {"job": "j"})


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: os.remove(os.path.join(d, "state/0/1/3.changelog")), r"state/0/1/3.changelog is missing"),
        (lambda d: _write(os.path.join(d, "state/0/1/3.changelog"), "st"), r"has 2 bytes, the manifest says 7 \(truncated or changed\)"),
        (lambda d: _write(os.path.join(d, "state/0/1/3.changelog"), "STATE 3"), r"does not match its checksum"),
        (lambda d: _write(os.path.join(d, "state/0/1/9.changelog"), "new"), r"9.changelog is not part of the savepoint"),
        (lambda d: _write(os.path.join(d, MANIFEST), "{not json"), r"manifest .* is corrupt"),
        (lambda d: os.remove(os.path.join(d, MANIFEST)), r"is not a savepoint"),
    ],
)
def test_damage_is_found(checkpoint, tmp_path, damage, message):
    dest = str(tmp_path / "sp")
    cut_checkpoint(checkpoint, dest, {"job": "j"})
    damage(dest)
    with pytest.raises(SavepointError, match=message):
        verify(dest)


def test_nothing_committed_nothing_saved_and_delete_refuses_other_directories(checkpoint, tmp_path):
    empty = tmp_path / "empty"
    (empty / "offsets").mkdir(parents=True)
    with pytest.raises(SavepointError, match="no committed micro-batch"):
        cut_checkpoint(str(empty), str(tmp_path / "sp"), {})
    assert not (tmp_path / "sp").exists() and not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]
    with pytest.raises(SavepointError, match="is not a savepoint"):
        delete_savepoint(checkpoint)
    assert os.path.isdir(checkpoint)


def test_added_state_is_compatible_removed_or_changed_state_is_not():
    def manifest(states):
        op = {"name": "f", "kind": "process function", "keys": ["k"], "state": {"state descriptors": states}}
        return {"sources": [], "bounded": False, "operators": [op]}

    base = {"n": "ValueStateDescriptor"}
    assert compare(manifest(base), manifest({**base, "m": "MapStateDescriptor"})) == []
    (removed,) = compare(manifest({**base, "m": "MapStateDescriptor"}), manifest(base))
    assert "'m' (MapStateDescriptor) was removed" in removed
    (changed,) = compare(manifest(base), manifest({"n": "ListStateDescriptor"}))
    assert "'n' was a ValueStateDescriptor, now a ListStateDescriptor" in changed
    json.dumps(manifest(base))


def test_a_stop_that_does_not_come_times_out_on_the_injected_clock(tmp_path):
    """A job that never honours the stop request: the wait ends after timeout_s of the
    given clock (a manual clock: no real waiting), and no savepoint is taken."""
    import socket

    from ember.errors import SavepointError
    from ember.runner.spark.checkpoint import CheckpointLayout
    from ember.savepoints import create_savepoint
    from ember.time.clock import ManualClock

    layout = CheckpointLayout(str(tmp_path / "job"))
    os.makedirs(layout.ember_dir)
    with open(layout.running, "w") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "job": "stuck"}, f)
    clock = ManualClock()
    with pytest.raises(SavepointError, match="did not stop within 30 s; no savepoint was taken"):
        create_savepoint(layout.path, str(tmp_path / "sp"), stop=True, timeout_s=30, clock=clock)
    assert os.path.exists(layout.stop_request) and 30_000 <= clock.now_ms() <= 30_200
    assert not (tmp_path / "sp").exists()
