"""``CEP.pattern(...).process(fn, schema, dead_letter=tag)``: an event a condition raises on
becomes a dead letter and leaves every partial match as it was — the step's matches are the
reference's (tests/cep_model.py) over the events without it — and a match the handler raises
on becomes a dead letter carrying the match; without the tag either fails the job. Driven
through the keyed runtime's bucket function (event time, the watermark a batch behind), without
Spark."""

from __future__ import annotations

import json
from collections import defaultdict

import cep_model
import pytest
from cep_bucket import batches, drive

from ember import OutputTag
from ember.cep import CEP, Pattern, PatternProcessFunction
from ember.cep.operator import CepFunction, SelectFunction
from ember.errors import PipelineError, UserFunctionError
from ember.functions import DEAD_LETTER_SCHEMA
from ember.runner.spark.keyed.runtime import TAG, side_column

BOUND = 3
FIELDS = ["k", "ts", "t", "v", "n"]
BAD = OutputTag("bad")


def is_(kind):
    return lambda e: e["t"] == kind


# The first stage's condition reads v first, so it raises on every poisoned event (v = "?").
PATTERNS = {
    "relaxed": Pattern.begin("a").where(lambda e: e["v"] >= 0 and e["t"] == "a")
    .followed_by("b").where(is_("b")).one_or_more().followed_by("c").where(lambda e: e["v"] > 4).within(8),
    "strict": Pattern.begin("a").where(lambda e: e["v"] >= 0 and e["t"] == "a").next("b").where(is_("b")),
    "negation": Pattern.begin("a").where(lambda e: e["v"] >= 0 and e["t"] == "a")
    .not_followed_by("x").where(is_("d")).followed_by("c").where(is_("c")).within(8),
}


class Emit(PatternProcessFunction):
    """A match as its key and its events' ``ts*100+n``; raises on matches starting with v = 7
    when ``fussy``."""

    def __init__(self, fussy=False):
        self.fussy = fussy

    def process_match(self, match, ctx):
        first = match[next(iter(match))][0]
        if self.fussy and first["v"] == 7:
            raise ValueError("seven")
        yield {"k": first["k"], "seqs": seqs(match)}


def seqs(match):
    return " ".join(str(e["ts"] * 100 + e["n"]) for s in match.values() for e in s)


def fussy_select(match):
    """``select``'s function: what ``Emit(fussy=True)`` yields, as one record."""
    first = match[next(iter(match))][0]
    if first["v"] == 7:
        raise ValueError("seven")
    return {"k": first["k"], "seqs": seqs(match)}


HANDLERS = {"Emit": lambda: Emit(fussy=True), "SelectFunction": lambda: SelectFunction(fussy_select)}


def on_time(data):
    """The events that were not late when they came (``ts >`` Flink's watermark, ``max -
    bound - 1`` over the batches before), poisoned ones included."""
    kept, watermark = [], None
    for batch in data:
        kept += [e for e in batch if watermark is None or e["ts"] > watermark]
        if batch:
            latest = max(e["ts"] for e in batch) - BOUND - 1
            watermark = latest if watermark is None else max(watermark, latest)
    return kept


def reference(pattern, events):
    per_key = defaultdict(list)
    for e in events:
        per_key[e["k"]].append(e)
    out = []
    for key, evs in per_key.items():
        evs = sorted(evs, key=lambda e: e["ts"])
        out += [(key, seqs(m), m) for m in cep_model.emitted(pattern, evs, [e["ts"] for e in evs])]
    return out


def run(pattern, data, handler, dead_letter):
    fn = CepFunction(pattern, handler, "cep", dead_letter=dead_letter)
    sides = {BAD.name: ["raw", "error"]} if dead_letter is not None else {}
    out, _ = drive(fn, data, FIELDS, ["k", "seqs"], sides, BOUND)
    main = sorted((r["k"], r["seqs"]) for _, r in out.iterrows() if r.get(TAG) is None or r[TAG] != BAD.name)
    dead = [(r[side_column("bad", "raw")], r[side_column("bad", "error")]) for _, r in out.iterrows()
            if r.get(TAG) == BAD.name]
    return main, dead


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_an_event_a_condition_raises_on_is_a_dead_letter_and_changes_no_match(name):
    pattern = PATTERNS[name]
    matched = poisoned = 0
    for seed in range(10):
        data = batches(seed, BOUND, poison=0.17)
        events = on_time(data)
        main, dead = run(pattern, data, Emit(), BAD)
        clean = [e for e in events if e["v"] != "?"]
        assert main == sorted((k, s) for k, s, _ in reference(pattern, clean)), seed
        bad = [e for e in events if e["v"] == "?"]
        assert sorted(json.loads(raw)["n"] for raw, _ in dead) == sorted(e["n"] for e in bad), seed
        assert {json.loads(raw)["ts"] for raw, _ in dead} == {e["ts"] for e in bad}, seed
        assert all(error.startswith("step 'cep': a pattern condition raised TypeError") for _, error in dead)
        matched += len(main)
        poisoned += len(dead)
    assert matched > 0 and poisoned > 0


@pytest.mark.parametrize("handler", sorted(HANDLERS))
def test_a_match_the_handler_raises_on_is_a_dead_letter_carrying_the_match(handler):
    pattern = PATTERNS["relaxed"]
    failed = kept = 0
    for seed in range(10):
        data = [[{**e, "v": 3 if e["v"] == "?" else e["v"]} for e in batch] for batch in batches(seed, BOUND, poison=0.17)]
        main, dead = run(pattern, data, HANDLERS[handler](), BAD)
        expected = reference(pattern, on_time(data))
        assert main == sorted((k, s) for k, s, m in expected if m["a"][0]["v"] != 7), seed
        assert sorted(seqs(json.loads(raw)) for raw, _ in dead) == sorted(s for _, s, m in expected if m["a"][0]["v"] == 7)
        assert all(error == f"step 'cep': {handler}.process_match raised ValueError: seven" for _, error in dead)
        failed += len(dead)
        kept += len(main)
    assert failed > 0 and kept > 0


def test_without_a_dead_letter_tag_a_raising_condition_or_handler_fails_the_step():
    data = [[{"k": "x", "ts": 1, "t": "a", "v": "?", "n": 1}]]
    with pytest.raises(UserFunctionError, match="step 'cep': a pattern condition raised TypeError"):
        run(PATTERNS["relaxed"], data, Emit(), None)
    data = [[{"k": "x", "ts": 1, "t": "a", "v": 7, "n": 1}, {"k": "x", "ts": 2, "t": "b", "v": 1, "n": 2},
             {"k": "x", "ts": 3, "t": "c", "v": 5, "n": 3}]]
    for handler in HANDLERS:
        with pytest.raises(UserFunctionError, match=f"step 'cep': {handler}.process_match raised ValueError: seven on match"):
            run(PATTERNS["relaxed"], data, HANDLERS[handler](), None)


def test_the_dead_letter_tag_is_checked_when_declared():
    from ember import ScriptedSource, StreamEnvironment

    env = StreamEnvironment()
    keyed = env.from_source(ScriptedSource([[]], "k string, ts bigint, t string, v int")).key_by("k")
    with pytest.raises(PipelineError, match="carries dead letters"):
        CEP.pattern(keyed, PATTERNS["strict"]).process(Emit(), "k string, seqs string",
                                                        dead_letter=OutputTag("bad", "x int"))
    step = CEP.pattern(keyed, PATTERNS["strict"]).select(lambda m: m, "k string", dead_letter=BAD, name="p")
    assert step._node.dead_letter == OutputTag("bad", DEAD_LETTER_SCHEMA)
