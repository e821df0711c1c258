"""Compile a pipeline graph into one Spark Structured Streaming query.

Each graph node type has exactly one translator in ``TRANSLATORS`` (filled by
the modules of :mod:`ember.runner.spark.translators`). A node without a
translator, or one Spark rejects while the plan is built, fails here — before
the job starts — with the step's name in the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ember.api.environment import EnvironmentConfig
from ember.errors import EmberError, PipelineError
from ember.graph.graph import Graph
from ember.graph.nodes import Node, SinkNode
from ember.time.watermarks import WatermarkStrategy

__all__ = ["Frame", "Compilation", "CompiledJob", "TRANSLATORS", "translates", "registry", "compile_graph"]


@dataclass(frozen=True)
class Frame:
    """A translated step: its Spark DataFrame and the stream's notion of time."""

    df: Any
    time: WatermarkStrategy | None = None


def registry(table: dict[type, Callable[..., Any]]) -> Callable[[type], Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """A decorator factory filling ``table`` with one function per declaration type."""

    def for_type(kind: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if kind in table:
                raise RuntimeError(f"two functions registered for {kind.__name__}")
            table[kind] = fn
            return fn

        return register

    return for_type


Translator = Callable[["Compilation", Node], Frame]
TRANSLATORS: dict[type[Node], Translator] = {}
translates = registry(TRANSLATORS)  # @translates(NodeType): the translator of one node type


@dataclass
class Compilation:
    """State of one compilation: the session, settings and translated frames."""

    graph: Graph
    spark: Any
    config: EnvironmentConfig
    job_name: str
    checkpoint: str | None
    end_of_input_marker: str | None = None
    stop_marker: str | None = None
    uses_end_of_input: bool = False  # an end-of-input row was compiled in: flush it when sources end
    frames: dict[int, Frame] = field(default_factory=dict)

    @property
    def parallelism(self) -> int:
        return self.config.parallelism or self.spark.sparkContext.defaultParallelism

    @property
    def bounded(self) -> bool:
        return all(s.source.bounded for s in self.graph.sources)

    def frame(self, node: Node) -> Frame:
        """The translated frame of ``node`` (translated once, then reused)."""
        if id(node) in self.frames:
            return self.frames[id(node)]
        translator = TRANSLATORS.get(type(node))
        if translator is None:
            raise PipelineError(f"the Spark runner cannot run a {type(node).__name__} step", node.name)
        try:
            frame = translator(self, node)
        except EmberError:
            raise
        except Exception as exc:  # Spark's analysis errors: unknown column, type mismatch...
            raise PipelineError(_spark_message(exc), node.name) from exc
        self.frames[id(node)] = frame
        return frame


@dataclass
class CompiledJob:
    sink: SinkNode
    frame: Frame
    compilation: Compilation

    @property
    def df(self) -> Any:
        return self.frame.df

    @property
    def output_mode(self) -> str:
        return "append"

    def spark_plan(self) -> str:
        df = self.frame.df
        return df._sc._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "extended")


def compile_graph(
    graph: Graph,
    spark: Any,
    config: EnvironmentConfig,
    *,
    job_name: str,
    checkpoint: str | None,
    end_of_input_marker: str | None = None,
    stop_marker: str | None = None,
) -> CompiledJob:
    """Translate ``graph`` (validated) for ``spark``; nothing starts running."""
    from ember.runner.spark import translators  # noqa: F401 - fills TRANSLATORS
    from ember.runner.spark.datasources import register_sources

    register_sources(spark)
    comp = Compilation(graph, spark, config, job_name, checkpoint, end_of_input_marker, stop_marker)
    sink = graph.sinks[0]
    frame = comp.frame(sink.inputs[0])
    return CompiledJob(sink, frame, comp)


def _spark_message(exc: Exception) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:800]

