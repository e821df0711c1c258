"""Generator reference models: replayable, random-access, exact ground truth."""

import numpy as np
import pytest

from ember.bench.stats import percentiles
from ember.connectors.generators import (
    STATE_NAMES,
    TRANSITIONS,
    GrepSource,
    StateMachineSource,
    YahooSource,
    dictionary_words,
)
from ember.runner.spark.generator_batches import partition_offsets, sequence_batches, source_spec


def test_yahoo_reference_is_a_pure_function_of_seed_and_seq():
    a = YahooSource(seed=3).reference(1000, 2000, start_ms=0)
    b = YahooSource(seed=3).reference(1000, 2000, start_ms=0)
    c = YahooSource(seed=4).reference(1000, 2000, start_ms=0)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["ad"], c["ad"])
    # a sub-range is the same slice of a larger range: random access
    whole = YahooSource(seed=3).reference(0, 5000, start_ms=0)
    assert np.array_equal(whole["ad"][1000:2000], a["ad"])


def test_yahoo_fields_are_uniform_and_skew_bounded():
    src = YahooSource(skew_ms=50, nominal_rate=1000)
    r = src.reference(0, 300_000, start_ms=10_000)
    views = np.mean(r["event_type"] == 0)
    assert 0.32 < views < 0.35
    assert set(np.unique(r["ad"])) == set(range(1000))
    nominal = 10_000 + np.arange(300_000) * 1000 // 1000
    assert np.abs(r["event_time"] - nominal).max() <= 50


def test_yahoo_expected_window_counts_sum_to_views():
    src = YahooSource(nominal_rate=10_000)
    counts = src.expected_window_counts(0, 100_000, start_ms=0, size_ms=1000)
    r = src.reference(0, 100_000, start_ms=0)
    assert sum(counts.values()) == int(np.sum(r["event_type"] == 0))
    assert len({c for c, _ in counts}) == 100
    assert len(src.campaign_table()) == 1000


def test_grep_sentences():
    src = GrepSource(partitions=2)
    s0, s1 = src.sentences(0), src.sentences(1)
    assert len(s0) == 2000 and s0 != s1
    assert all(len(s.split()) <= 24 for s in s0)
    assert all(s == "" or s.endswith(" ") for s in s0)
    assert 40 < np.mean([len(s) for s in s0 + s1]) < 70
    assert len(set(dictionary_words())) == 127_000
    assert src.expected_matches(r"[A-Z]{3}\.", 0, 100_000) == 0
    # a pattern that matches: the empty sentence (0 words) appears ~1/25 of the time
    empty_idx = [i for i, s in enumerate(s0) if s == ""]
    expected = sum(1 for seq in range(0, 40_000, 2) if (seq // 2) % 2000 in empty_idx)
    expected += sum(1 for seq in range(1, 40_000, 2) if (seq // 2) % 2000 in [i for i, s in enumerate(s1) if s == ""])
    assert src.expected_matches(r"", 0, 40_000) == expected > 0


def _run_state_machine(addresses, types):
    """An independent per-address state machine over the generated events."""
    state: dict[int, int] = {}
    alerts = []
    for a, t in zip(addresses.tolist(), types.tolist()):
        s = state.get(a, 0)
        nxt = TRANSITIONS.get(s, {}).get(t)
        if nxt is None:
            alerts.append((a, STATE_NAMES[s], t))
        elif nxt == 5:
            state.pop(a, None)
        else:
            state[a] = nxt
    return alerts, state


def test_state_machine_alerts_equal_the_injected_events():
    src = StateMachineSource(partitions=2, active_addresses=100, frames_per_epoch=20, invalid_rate=0.01)
    total = 3 * 2 * src.events_per_epoch + 77
    alerts = []
    for p in range(2):
        n = len(range(p, total, 2))
        addr, types, _ = src.events(p, 0, n)
        got, _ = _run_state_machine(addr, types)
        alerts.extend(got)
    assert sorted(alerts) == src.expected_alerts(total)
    # 20 invalid frames per epoch (1 % of 100 x 20), 3 full epochs per partition
    assert len(alerts) >= 2 * 3 * 20


def test_state_machine_random_access_and_disjoint_partitions():
    src = StateMachineSource(partitions=2, active_addresses=50, frames_per_epoch=10, invalid_rate=0.0)
    whole = src.events(0, 0, 5000)
    part = src.events(0, 1234, 3210)
    assert all(np.array_equal(w[1234:3210], p) for w, p in zip(whole, part))
    a0 = set(src.events(0, 0, 3000)[0].tolist())
    a1 = set(src.events(1, 0, 3000)[0].tolist())
    assert not a0 & a1
    alerts, _ = _run_state_machine(*whole[:2])
    assert alerts == []
    e = src.events_per_epoch
    assert e == sum(len(s) * c for s, c in zip(((1, 2, 5, 7), (3, 2, 5, 7), (3, 4, 7)), src._frame_counts[:3]))


def test_sequence_partitioning_covers_each_seq_once():
    seen = []
    for p in range(3):
        a, b = partition_offsets(p, 3, 10, 31)
        seen.extend(o * 3 + p for o in range(a, b))
    assert sorted(seen) == list(range(10, 31))


def test_python_driver_batches_match_the_reference():
    src = StateMachineSource(partitions=2, active_addresses=20, frames_per_epoch=5)
    spec = source_spec(src, 1000)
    batches = list(sequence_batches(spec, 1, 100, 400, origin_ms=5000, chunk=64))
    got_addr = np.concatenate([b.column("address").to_numpy() for b in batches])
    a, b = partition_offsets(1, 2, 100, 400)
    assert np.array_equal(got_addr, src.events(1, a, b)[0])
    ts = np.concatenate([b.column("ts").to_numpy() for b in batches])
    assert ts[0] == 5000 + ((a * 2 + 1) * 1000) // 1_000_000


def test_percentiles_nearest_rank():
    assert percentiles([]) is None
    p = percentiles(range(1, 101))
    assert p == {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}
    assert percentiles([7])["p99"] == 7.0


@pytest.mark.parametrize("bad", [{"active_addresses": 0}, {"invalid_rate": 1.5}])
def test_state_machine_validation(bad):
    from ember import ConfigError

    with pytest.raises(ConfigError):
        StateMachineSource(**bad)
