"""A pattern's SQL conditions are columns Spark computes before the step (``__cep_<i>``):
the events a handler receives — in matches, in partial matches that timed out, in trailing
matches completed by time — never carry them. Driven through the keyed runtime's bucket
function, without Spark."""

from __future__ import annotations

import pytest
from cep_bucket import drive

from ember import OutputTag
from ember.cep import Pattern, PatternProcessFunction
from ember.cep.operator import SQL_PREFIX, CepFunction

FIELDS = ["k", "ts", "t", f"{SQL_PREFIX}0"]


class Fields(PatternProcessFunction):
    """Notes each match (or timed-out one) as the sorted field names of its events."""

    def __init__(self):
        self.seen = []

    def process_match(self, match, ctx):
        self.seen.append(("match", " ".join(sorted({f for s in match.values() for e in s for f in e}))))

    def process_timed_out_match(self, match, ctx):
        self.seen.append(("timed out", " ".join(sorted({f for s in match.values() for e in s for f in e}))))


@pytest.mark.parametrize("in_batch", [False, True], ids=["next-batch", "in-batch"])
def test_handlers_never_see_the_sql_conditions_columns(in_batch):
    followed = Pattern.begin("a").where("t = 'a'").followed_by("b").where(lambda e: e["t"] == "b").within(5)
    trailing = Pattern.begin("a").where("t = 'a'").not_followed_by("x").where(lambda e: e["t"] == "x").within(5)
    data = [[{"k": "u", "ts": 1, "t": "a", f"{SQL_PREFIX}0": True}, {"k": "u", "ts": 2, "t": "b", f"{SQL_PREFIX}0": False},
             {"k": "v", "ts": 3, "t": "a", f"{SQL_PREFIX}0": True}], [{"k": "w", "ts": 20, "t": "c", f"{SQL_PREFIX}0": False}]]
    seen = []
    for p in (followed, trailing):
        handler = Fields()
        fn = CepFunction(p, handler, "cep", timed_out=OutputTag("partial", "k string"), sql_columns={"t = 'a'": f"{SQL_PREFIX}0"})
        drive(fn, data, FIELDS, ["k"], {"partial": ["k"]}, 1, in_batch=in_batch)
        seen += sorted(handler.seen)
    # followed: u matches (a, b), v times out; trailing: u and v match when their windows end
    assert seen == [("match", "k t ts"), ("timed out", "k t ts"), ("match", "k t ts"), ("match", "k t ts")]
