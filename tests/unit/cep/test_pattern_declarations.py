"""Pattern declarations are checked when declared (or when CEP.pattern validates them), with
messages naming the stage."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ember import StreamEnvironment
from ember.cep import CEP, Pattern, PatternProcessFunction, SkipStrategy
from ember.errors import PipelineError


def a():
    return Pattern.begin("a").where(lambda e: e["t"] == "a")


@pytest.mark.parametrize(("build", "message"), [
    (lambda: a().followed_by("b").times(0), r"step 'b': times takes counts >= 1, got 0"),
    (lambda: a().followed_by("b").times(3, 2), r"step 'b': times\(3, 2\)"),
    (lambda: a().followed_by("a"), r"step 'a': two stages are named 'a'"),
    (lambda: a().where(42), r"step 'a': a condition is a callable or a SQL expression string"),
    (lambda: a().where(lambda e, ctx, extra: True), r"takes \(event\) or \(event, ctx\)"),
    (lambda: a().or_(lambda e: True).followed_by("b").or_(lambda e: True), r"step 'b': or_ needs a where before it"),
    (lambda: a().followed_by("b").greedy(), r"step 'b': greedy\(\) applies to a looping stage"),
    (lambda: Pattern.begin("a", skip="past"), r"skip must be a SkipStrategy"),
])
def test_refused_when_declared(build, message):
    with pytest.raises(PipelineError, match=message):
        build()


@pytest.mark.parametrize(("pattern", "message"), [
    (a().followed_by("b").one_or_more(), r"step 'b': an unbounded last stage .* without within\(...\) or until"),
    (a().not_followed_by("x").where(lambda e: True), r"step 'x': not_followed_by as the last stage needs within"),
    (a().not_next("x").where(lambda e: True).within(5), r"step 'x': not_next cannot end a pattern"),
    (a().not_followed_by("x").within(5), r"step 'x': a negative stage needs a where"),
    (a().not_followed_by("x").where(lambda e: True).times(2).followed_by("b"), r"step 'x': a negative stage .* takes no quantifier"),
    (a().followed_by("b").optional().not_followed_by("x").where(lambda e: True).followed_by("c"),
     r"step 'x': a negative stage cannot follow an optional or negative stage \('b'\)"),
    (a().followed_by("b").until(lambda e: True).followed_by("c"), r"step 'b': until applies to a looping stage"),
    (Pattern.begin("a").optional(), r"step 'a': every stage is optional"),
    (a().followed_by("b").times(1, 3).greedy(), r"step 'b': greedy\(\) needs a stage that is not optional after the loop"),
    (a().followed_by("b").times(1, 3).greedy().followed_by("c").optional(), r"step 'b': greedy\(\) needs a stage"),
    (a().followed_by("b").times(1, 3).greedy().times(1), r"step 'b': greedy\(\) applies to a looping stage"),
    (a().followed_by("b").skip_strategy(SkipStrategy.skip_to_first("z")), r"the skip strategy names 'z', which is not a stage"),
])
def test_refused_when_validated(pattern, message):
    with pytest.raises(PipelineError, match=message):
        pattern.validate()


def test_cep_pattern_checks_its_arguments():
    env = StreamEnvironment()
    events = env.from_collection([(1, "a")], "ts bigint, t string")
    with pytest.raises(PipelineError, match="takes a stream"):
        CEP.pattern([(1, "a")], a())
    whole = CEP.pattern(events, a())  # a plain stream: one key, the whole stream
    assert whole.stream.keys == ()
    keyed = events.key_by("t")
    with pytest.raises(PipelineError, match="step 'b': an unbounded last stage"):
        CEP.pattern(keyed, a().followed_by("b").one_or_more())
    stream = CEP.pattern(keyed, a().followed_by("b").within(timedelta(seconds=1)))
    with pytest.raises(PipelineError, match="takes a PatternProcessFunction"):
        stream.process(lambda m: m, "x int")
    with pytest.raises(PipelineError, match="timed_out takes an OutputTag with a schema"):
        stream.process(PatternProcessFunction(), "x int", timed_out="late")
    untimed = CEP.pattern(keyed, a().followed_by("b"))
    from ember import OutputTag
    with pytest.raises(PipelineError, match="timed_out needs a pattern with within"):
        untimed.process(PatternProcessFunction(), "x int", timed_out=OutputTag("t", "x int"))


def test_describe_reads_like_the_declaration():
    p = a().followed_by("b").times(2).consecutive().not_followed_by("x").where(lambda e: True).within(timedelta(seconds=3))
    assert p.describe() == "a relaxed b{2,2} strict not_followed_by x within 3000 ms"
