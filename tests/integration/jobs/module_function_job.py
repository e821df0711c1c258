"""A job whose user function is module-level: it must reach Spark's workers by value."""

from ember import CollectSink, ScriptedSource

SINK = CollectSink()


def shout(record):
    return {"word": record["word"].upper()}


def build(env):
    env.from_source(ScriptedSource([[("quiet",), ("calm",)]], "word string")).map(shout).sink_to(SINK)
