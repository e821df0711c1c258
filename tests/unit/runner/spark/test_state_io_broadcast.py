"""Writing a broadcast step's keyed state into a savepoint keeps its broadcast state (no Spark:
the keys written are the savepoint's own, so none needs placing in a bucket)."""

import pandas as pd

from ember.runner.spark.keyed.runtime import BROADCAST, empty_bucket_state
from ember.runner.spark.state_io import _new_keyed_blobs


def test_every_bucket_keeps_its_copy_of_the_broadcast_state_when_keyed_state_is_written():
    rules = {"rules": {"r1": 5}}
    old = {}
    for bucket, key in ((3, "a"), (7, "b"), (9, None)):  # bucket 9 holds no key, only the rules
        blob = empty_bucket_state()
        if key is not None:
            blob["keys"][key] = {"seen": 1}
        blob[BROADCAST] = {"rules": dict(rules["rules"])}
        old[bucket] = blob
    frame = pd.DataFrame({"k": ["a"], "state": ["seen"], "value": [42]})  # b's state dropped, a's rewritten
    new = _new_keyed_blobs(None, old, {"keys": ["k"], "name": "check"}, frame)
    assert new[3]["keys"] == {"a": {"seen": 42}}
    assert set(new) == {3, 7, 9} and all(blob[BROADCAST] == rules for blob in new.values())
    assert new[3][BROADCAST] is not new[7][BROADCAST]  # copies: a bucket's update stays its own
