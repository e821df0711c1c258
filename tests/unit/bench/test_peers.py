"""``ember bench peers``: what each job must output, and the checks that judge a peer's run
(no Spark, no peer installed: the peers' runs themselves are the benchmark's, outside CI)."""

from __future__ import annotations

import json

import pytest

from ember.bench.peers import peer_events as ev
from ember.bench.peers.runner import expected_windows, merge_tallies, verify
from ember.cli.main import main


def _brute_windows(events: int, keys: int, per_second: int) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for i in range(events):
        w = (ev.time_of(i, per_second) // 1000 * 1000)
        out[(ev.key_of(i, keys), w)] = out.get((ev.key_of(i, keys), w), 0) + 1
    return out


@pytest.mark.parametrize("events,keys,per_second", [(10_000, 100, 1_000), (12_345, 7, 999), (5, 10, 3), (3_001, 3, 1_500)])
def test_expected_windows_match_the_events(events, keys, per_second):
    assert expected_windows(events, keys, per_second) == _brute_windows(events, keys, per_second)


def test_running_count_checksum_and_final_counts():
    counts: dict[int, int] = {}
    outputs = total = 0
    for i in range(1_003):
        k = ev.key_of(i, 10)
        counts[k] = counts.get(k, 0) + 1
        outputs, total = outputs + 1, total + counts[k]
        assert ev.event_index(k, counts[k], 10) == i
    assert ev.expected_final_counts(1_003, 10) == counts
    assert ev.running_count_checksum(1_003, 10) == (outputs, total)


def _running_tally(events: int, keys: int) -> dict:
    counts: dict[int, int] = {}
    t = {"outputs": 0, "total": 0, "late": 0, "latest": {}, "windows": [], "latency_ms": [], "last": 0.0}
    for i in range(events):
        k = i % keys
        counts[k] = counts.get(k, 0) + 1
        t["outputs"] += 1
        t["total"] += counts[k]
    t["latest"] = dict(counts)
    return t


def test_verify_accepts_a_right_running_count_and_catches_wrong_ones():
    good = _running_tally(1_000, 7)
    assert verify("per-record", good, 1_000, 7, 100)[0]
    assert not verify("per-record", dict(good, outputs=999), 1_000, 7, 100)[0]  # an output lost
    assert not verify("per-record", dict(good, total=good["total"] + 1), 1_000, 7, 100)[0]  # a wrong count
    assert not verify("per-record", dict(good, latest={**good["latest"], 3: 1}), 1_000, 7, 100)[0]
    assert verify("final", {"latest": good["latest"], "outputs": 7}, 1_000, 7, 100)[0]
    assert not verify("final", {"latest": {**good["latest"], 0: 0}, "outputs": 7}, 1_000, 7, 100)[0]


def test_verify_windows_catches_missing_duplicated_wrong_and_late():
    exp = expected_windows(5_000, 10, 1_000)
    rows = [(k, s, n) for (k, s), n in exp.items()]
    base = {"windows": rows, "late": 0}
    assert verify("window", base, 5_000, 10, 1_000)[0]
    assert not verify("window", dict(base, windows=rows[1:]), 5_000, 10, 1_000)[0]
    assert not verify("window", dict(base, windows=rows + rows[:1]), 5_000, 10, 1_000)[0]
    k, s, n = rows[0]
    assert not verify("window", dict(base, windows=[(k, s, n - 1)] + rows[1:]), 5_000, 10, 1_000)[0]
    assert not verify("window", dict(base, late=1), 5_000, 10, 1_000)[0]


def test_merge_tallies_adds_partitions(tmp_path):
    parts = [
        {"outputs": 2, "total": 3, "late": 0, "latest": {"1": 2}, "windows": [[1, 0, 2]], "latency_ms": [1.0], "last": 5.0},
        {"outputs": 1, "total": 1, "late": 1, "latest": {"2": 1, "1": 1}, "windows": [[2, 0, 1]], "latency_ms": [2.0], "last": 7.0},
    ]
    paths = []
    for i, p in enumerate(parts):
        path = tmp_path / f"t.{i}.json"
        path.write_text(json.dumps(p))
        paths.append(path)
    m = merge_tallies(paths)
    assert (m["outputs"], m["total"], m["late"], m["last"]) == (3, 4, 1, 7.0)
    assert m["latest"] == {1: 2, 2: 1} and sorted(m["windows"]) == [(1, 0, 2), (2, 0, 1)]
    assert sorted(m["latency_ms"]) == [1.0, 2.0]


def test_percentiles_nearest_rank():
    p = ev.percentiles([float(x) for x in range(1, 101)])
    assert (p["p50"], p["p90"], p["p99"], p["max"], p["samples"]) == (50, 90, 99, 100, 100)
    assert ev.percentiles([]) == {}


@pytest.mark.parametrize("argv,message", [
    (["bench", "grep", "--events", "10"], "belong to ember bench peers"),
    (["bench", "peers", "--systems", "ember,kafka"], "--systems"),
    (["bench", "peers", "--events", "0"], "--events must be > 0"),
    (["bench", "peers", "--latency-seconds", "-1"], "--latency-seconds"),
])
def test_peers_options_checked_before_anything_runs(argv, message, capsys):
    assert main(argv) != 0
    assert message in capsys.readouterr().err


def test_peers_belongs_to_the_report(capsys):
    assert main(["bench", "grep", "--peers"]) != 0
    assert "--peers belongs to ember bench report" in capsys.readouterr().err
