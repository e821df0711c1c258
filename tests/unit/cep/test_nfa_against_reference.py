"""Ember's matcher (ember.cep.nfa) against the brute-force reference (tests/cep_model.py) on
seeded random sequences, for every contiguity, quantifier and skip strategy."""

from __future__ import annotations

import random
import zlib

import cep_model
import pytest

from ember.cep import Pattern, SkipStrategy
from ember.cep.nfa import Matcher, compile_pattern


def is_(kind):
    return lambda e: e["t"] == kind


def run_matcher(pattern: Pattern, events: list[dict], times: list[int]) -> list[dict]:
    matcher = Matcher(compile_pattern(pattern))
    partials, out = [], []
    for seq, (ts, e) in enumerate(zip(times, events)):
        partials, done, _expired = matcher.event(partials, seq, ts, e)
        out.extend(matcher.as_dict(m) for m in done)
    partials, done, _expired = matcher.advance(partials, 1 << 62)  # end of input
    out.extend(matcher.as_dict(m) for m in done)
    return out


W = 5
PATTERNS = {
    "next": Pattern.begin("a").where(is_("a")).next("b").where(is_("b")),
    "followed_by": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")),
    "followed_by_any": Pattern.begin("a").where(is_("a")).followed_by_any("b").where(is_("b")),
    "three": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).next("c").where(is_("c")),
    "times2": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).times(2),
    "times2_consecutive": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).times(2).consecutive(),
    "times1_3_any": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).times(1, 3).allow_combinations(),
    "one_or_more_then_c": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).one_or_more()
    .followed_by("c").where(is_("c")),
    "one_or_more_within": Pattern.begin("a").where(is_("a")).next("b").where(is_("b")).one_or_more().within(W),
    "times_or_more_until": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).times_or_more(1)
    .until(is_("c")).followed_by("d").where(lambda e: e["v"] > 5),
    "optional": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).optional().followed_by("c").where(is_("c")),
    "optional_loop_next": Pattern.begin("a").where(is_("a")).next("b").where(is_("b")).one_or_more().optional()
    .next("c").where(is_("c")),
    "not_next": Pattern.begin("a").where(is_("a")).not_next("x").where(is_("b")).followed_by("c").where(is_("c")),
    "not_followed_by": Pattern.begin("a").where(is_("a")).not_followed_by("x").where(is_("b")).followed_by("c").where(is_("c")),
    "trailing_not": Pattern.begin("a").where(is_("a")).not_followed_by("x").where(is_("b")).within(W),
    "iterative": Pattern.begin("a").where(is_("a")).followed_by("b").where(lambda e, ctx: e["v"] > ctx["a"][0]["v"]).one_or_more()
    .within(W),
    "or": Pattern.begin("a").where(is_("a")).or_(is_("c")).followed_by_any("b").where(is_("b")).where(lambda e: e["v"] % 2 == 0),
    "greedy": Pattern.begin("a").where(is_("a")).followed_by("b").where(lambda e: e["t"] in "bc" and e["v"] < 6).one_or_more().greedy()
    .followed_by("c").where(is_("c")),
    "greedy_times_next": Pattern.begin("a").where(is_("a")).next("b").where(lambda e: e["t"] != "a").times(1, 3).consecutive()
    .greedy().next("c").where(lambda e: e["v"] > 3),
    "greedy_any_within": Pattern.begin("a").where(is_("a")).followed_by_any("b").where(lambda e: e["v"] % 2 == 0).times_or_more(1)
    .allow_combinations().greedy().followed_by_any("c").where(is_("c")).within(W),
    "greedy_optional": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).one_or_more().optional().greedy()
    .followed_by("c").where(lambda e: e["t"] in "bc"),
    "greedy_negative": Pattern.begin("a").where(is_("a")).followed_by("b").where(lambda e: e["t"] in "bc").times(2, 3).greedy()
    .not_followed_by("x").where(is_("d")).followed_by("c").where(lambda e: e["v"] > 4).within(W),
    "within": Pattern.begin("a").where(is_("a")).followed_by_any("b").where(is_("b")).followed_by("c").where(is_("c")).within(W),
}
SKIPS = {
    "no_skip": SkipStrategy.no_skip(),
    "skip_to_next": SkipStrategy.skip_to_next(),
    "skip_past_last_event": SkipStrategy.skip_past_last_event(),
    "skip_to_first_b": SkipStrategy.skip_to_first("b"),
    "skip_to_last_b": SkipStrategy.skip_to_last("b"),
}


def sequences(seed: int, count: int, length: int):
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(1, length)
        events = [{"t": rng.choice("aabbcd"), "v": rng.randint(0, 9)} for _ in range(n)]
        times, t = [], 0
        for _ in range(n):
            t += rng.choice((0, 1, 1, 2))
            times.append(t)
        yield events, times


COMBINATIONS = [(n, k) for n in sorted(PATTERNS) for k in sorted(SKIPS) if SKIPS[k].stage in (None, *PATTERNS[n].names)]


@pytest.mark.parametrize(("name", "skip"), COMBINATIONS)
def test_matches_equal_the_references(name, skip):
    pattern = PATTERNS[name].skip_strategy(SKIPS[skip])
    checked = 0
    for events, times in sequences(zlib.crc32(f"{name}/{skip}".encode()), 80, 9):  # a fixed seed per case
        expected = cep_model.emitted(pattern, events, times)
        assert run_matcher(pattern, events, times) == expected, (events, times)
        checked += bool(expected)
    assert checked > 0, "no sequence matched: the comparison would check nothing"


def _is(name):
    return lambda e: e["t"] == name


def _a():
    return Pattern.begin("a").where(_is("a"))


DOC_TABLE = [  # docs/cep.md's semantics table: (pattern, events, matches as strings)
    (_a().followed_by("b").where(_is("b")), "a c b1 b2", ["a b1"]),
    (_a().followed_by_any("b").where(_is("b")), "a c b1 b2", ["a b1", "a b2"]),
    (_a().next("b").where(_is("b")), "a c b1", []),
    (_a().followed_by("b").where(_is("b")).one_or_more().followed_by("c").where(_is("c")), "a b1 c1 b2 c2",
     ["a b1 c1", "a b1 b2 c2"]),
    (_a().followed_by("b").where(_is("b")).times(2).consecutive(), "a x b1 b2", ["a b1 b2"]),
    (_a().followed_by("b").where(_is("b")).times(2).consecutive(), "a b1 x b2 b3", []),
    (_a().followed_by("b").where(_is("b")).times(1, 3).allow_combinations(), "a b1 b2 b3",
     ["a b1", "a b1 b2", "a b1 b3", "a b1 b2 b3"]),
    (_a().followed_by("b").where(_is("b")).optional().followed_by("c").where(_is("c")), "a b c", ["a b c", "a c"]),
    (_a().not_followed_by("x").where(_is("x")).followed_by("c").where(_is("c")), "a x c", []),
    (_a().followed_by("b").where(lambda e: e["t"] in "bc").one_or_more().followed_by("c").where(_is("c")), "a b1 c1 c2",
     ["a b1 c1", "a b1 c1 c2"]),
    (_a().followed_by("b").where(lambda e: e["t"] in "bc").one_or_more().greedy().followed_by("c").where(_is("c")),
     "a b1 c1 c2", []),
    (_a().followed_by("b").where(lambda e: e["t"] in "bc").times(1, 2).greedy().followed_by("c").where(lambda e: e["t"] == "c"),
     "a b1 b2 x c1", ["a b1 b2 c1"]),
]


@pytest.mark.parametrize("index", range(len(DOC_TABLE)))
def test_the_documented_examples(index):
    pattern, text, want = DOC_TABLE[index]
    names = text.split()
    events = [{"t": n[0], "id": n} for n in names]
    got = [" ".join(e["id"] for stage in m.values() for e in stage) for m in run_matcher(pattern, events, list(range(len(events))))]
    assert sorted(got) == sorted(want)
    assert sorted(got) == sorted(" ".join(e["id"] for stage in m.values() for e in stage)
                                 for m in cep_model.emitted(pattern, events, list(range(len(events)))))


def test_a_trailing_negative_completes_when_the_window_ends():
    pattern = _a().not_followed_by("x").where(_is("x")).within(5)
    matcher = Matcher(compile_pattern(pattern))
    partials, done, _ = matcher.event([], 0, 0, {"t": "a"})
    assert done == [] and len(partials) == 1
    partials, done, _ = matcher.advance(partials, 4)
    assert done == []  # the window is still open
    partials, done, _ = matcher.event(partials, 1, 7, {"t": "x"})  # after the window: does not cut it
    assert [matcher.as_dict(m) for m in done] == [{"a": [{"t": "a"}]}]


def test_timed_out_partial_matches_are_reported_once():
    pattern = _a().followed_by("b").where(_is("b")).one_or_more().within(5)
    matcher = Matcher(compile_pattern(pattern))
    partials, _, _ = matcher.event([], 0, 0, {"t": "a"})
    partials, done, _ = matcher.event(partials, 1, 1, {"t": "b"})
    assert len(done) == 1
    partials, done, expired = matcher.advance(partials, 5)
    assert partials == [] and done == []
    # {a b} waits for more b (its loop) and for nothing else ({a} took b: relaxed): reported once
    assert [len(m) for m in expired] == [2]


SEQUENCES = ("followed_by", "followed_by_any", "next", "three", "within")  # plain sequences: the matcher's fast path


def test_plain_sequences_take_the_fast_path_and_nothing_else_does():
    """So the reference comparisons above check the fast path on these patterns (and only these)."""
    fast = {name for name, pattern in PATTERNS.items() if Matcher(compile_pattern(pattern)).sequence is not None}
    assert fast == set(SEQUENCES)


@pytest.mark.parametrize("name", SEQUENCES)
def test_the_fast_path_keeps_the_general_loops_partial_matches(name):
    """Event by event, the same partial matches (state that checkpoints and savepoints keep),
    matches and timeouts as the general loop, under every skip strategy."""
    for skip in SKIPS.values():
        if skip.stage not in (None, *PATTERNS[name].names):
            continue
        plan = compile_pattern(PATTERNS[name].skip_strategy(skip))
        fast, general = Matcher(plan), Matcher(plan, fast=False)
        for events, times in sequences(zlib.crc32(name.encode()), 60, 12):
            mine: list = []
            theirs: list = []
            for seq, (ts, e) in enumerate(zip(times, events)):
                a, b = fast.event(mine, seq, ts, e), general.event(theirs, seq, ts, e)
                assert a == b, (events, times, seq)
                assert [fast.as_dict(m) for m in a[1] + a[2]] == [general.as_dict(m) for m in b[1] + b[2]]
                mine, theirs = a[0], b[0]
            assert fast.advance(mine, 1 << 62) == general.advance(theirs, 1 << 62)
