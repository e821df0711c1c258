"""What translators share: a translated step (:class:`Frame`), the state of one
compilation (:class:`Compilation`) and the translation table.

Each graph node type has exactly one translator in ``TRANSLATORS``, registered
with ``@translates(NodeType)`` by the modules of :mod:`ember.runner.spark.translators`;
:func:`ember.runner.spark.compiler.compile_graph` drives them. A node without a
translator, or one Spark rejects while its DataFrame is built, fails with the
step's name — before the job starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable

from ember.errors import EmberError, PipelineError
from ember.graph.graph import Graph
from ember.graph.nodes import Node, SourceNode
from ember.job import EnvironmentConfig
from ember.runner.spark.checkpoint import DONE_SUFFIX, CheckpointLayout, fixed_token
from ember.runner.spark.keyed.runtime import SIDE_PREFIX, TAG
from ember.runner.spark.planner import Plan
from ember.runner.spark.planner import plan as plan_graph
from ember.time.watermarks import WatermarkStrategy

__all__ = ["Frame", "Compilation", "TRANSLATORS", "translates", "registry", "main_output", "ROWS_METRIC"]

ROWS_METRIC = "ember_rows:"  # the observed metric counting one step's output rows (+ step name)


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
    tagged: dict[int, Frame] = field(default_factory=dict)  # combined main + side outputs of a step
    side_types: dict[int, Any] = field(default_factory=dict)  # step -> {side output: StructType}
    counters: dict[str, Any] = field(default_factory=dict)  # Spark accumulators, by name
    key_types: dict[str, list[str]] = field(default_factory=dict)  # keyed step -> its key fields' Spark types
    initial_states: list[str] = field(default_factory=list)  # the converted checkpoint's state files handed to keyed steps
    end_of_input_reads: int = 0  # the end-of-input readers built so far (each named apart: translators/eventtime.py)
    sql_operators: dict[str, int] = field(default_factory=dict)  # SQL step -> its query's Spark stateful operators
    detoured: dict[int, str] = field(default_factory=dict)  # step -> spool directory of its detoured dead letters
    # Sources read by Spark's own readers, which keep admitting input after the stop marker.
    unstoppable: list[str] = field(default_factory=list)
    # Bounded sources whose readers mark themselves done (their ``done_file``): the end-of-input
    # row may then come in the batch that reads their last input (translators/eventtime.py).
    marking: set[str] = field(default_factory=set)
    plan: Plan = None  # type: ignore[assignment]  # the graph's physical plan: computed once, shared by branches
    # Count every step's output rows (the dashboard, ember.ui): an observed metric per step in the
    # streaming query (``ROWS_METRIC`` + name, in each progress report), and in a branch compiled
    # per micro-batch (after the split) a pyspark Observation per step, read once its sink wrote.
    count_rows: bool = False
    observations: dict[str, Any] | None = None  # a branch's observations by step, or None in the streaming query
    lanes: dict[int, Any] = field(default_factory=dict)  # a fan-out's lanes by step (translators/keyed.py: Lane)
    # A lane's step whose own output is a view of its operator's rows (a join's projection of
    # its pairs): that view, applied to the lane's rows after the split (branch_from).
    lane_views: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.plan is None:
            self.plan = plan_graph(self.graph)

    @cached_property
    def layout(self) -> CheckpointLayout:
        """Where the job's files go (a temporary directory when compiled without a
        checkpoint, to explain); made on first use, not for every branch compiled."""
        return CheckpointLayout.for_explain(self.checkpoint)

    @property
    def job_id(self) -> str:
        """The job's identity, fixed in its checkpoint when the job first starts
        (sinks fence their writes under it: a new checkpoint is a new job)."""
        if self.checkpoint is None:
            return "explain"
        return fixed_token(self.layout.job_id)

    def counter(self, name: str) -> Any:
        """A job-wide Spark accumulator (e.g. late records dropped by Ember's windows)."""
        if name not in self.counters:
            self.counters[name] = self.spark.sparkContext.accumulator(0)
        return self.counters[name]

    @property
    def parallelism(self) -> int:
        return self.config.parallelism or self.spark.sparkContext.defaultParallelism

    @property
    def buckets(self) -> int:
        """How many state buckets keyed steps spread their keys over (``max_parallelism``)."""
        return self.config.max_parallelism

    @property
    def bounded(self) -> bool:
        return all(s.source.bounded for s in self.graph.sources)

    def done_file(self, node: Any) -> str:
        """Where bounded source ``node``'s reader marks that it read its last input ("" when
        the job has no end-of-input row; datasources.EndOfInputReader)."""
        if not (self.bounded and self.end_of_input_marker):
            return ""
        self.marking.add(node.name)
        return f"{self.end_of_input_marker}{DONE_SUFFIX}{node.name}"

    def branch(self, fork: Node, rows: Frame) -> "Compilation":
        """A compilation of the steps after ``fork`` on ``rows`` (its output in one micro-batch)."""
        return self.branch_from([(fork, rows)])

    def branch_from(self, seeds: list[tuple[Node, Frame]], counted: tuple[Node, ...] = ()) -> "Compilation":
        """A compilation of the steps after the ``seeds`` (each step with its output in one
        micro-batch: a split's one step, or a fan-out's lanes). ``counted``: seeds whose rows
        to count here (a fan-out's lanes, counted nowhere else)."""
        branch = replace(self, frames={}, tagged={}, side_types=dict(self.side_types), observations={})
        for node, rows in seeds:
            if self.count_rows and any(node is c for c in counted):
                rows = branch._counted(node, rows, main_of_combined=id(node) in self.tagged)
            if id(node) in self.tagged:
                branch.tagged[id(node)] = rows
                branch.frames[id(node)] = main_output(rows)
            else:
                branch.frames[id(node)] = rows
            view = self.lane_views.get(id(node))
            if view is not None:
                branch.frames[id(node)] = view(branch.frames[id(node)])
        return branch

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
        if self.side_types.get(id(node)):
            if self.count_rows:  # counted on the combined rows (main and side outputs), whichever a sink reads
                frame = self._counted(node, frame, main_of_combined=True)
            self.tagged[id(node)] = frame
            frame = main_output(frame)
        elif self.count_rows and _counted_here(self, node):
            frame = self._counted(node, frame)
        self.frames[id(node)] = frame
        return frame

    def _counted(self, node: Node, frame: Frame, main_of_combined: bool = False) -> Frame:
        """``frame`` counting its rows per micro-batch (``main_of_combined``: the main output's
        rows of a step's combined main and side outputs); a source's also its largest event time."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F
        from pyspark.sql.types import TimestampNTZType, TimestampType

        rows = F.count_if(F.col(TAG).isNull()) if main_of_combined else F.count(F.lit(1))
        metrics = [rows.alias("rows")]
        field = frame.time.timestamp_field if frame.time is not None and isinstance(node, SourceNode) else None
        if field is not None and field in frame.df.columns:
            column = F.col(field)
            if isinstance(frame.df.schema[field].dataType, (TimestampType, TimestampNTZType)):
                column = F.unix_millis(column.cast("timestamp"))
            metrics.append(F.max(column.cast("long")).alias("max_event_time_ms"))
        if self.observations is None or frame.df.isStreaming:  # (a branch on streaming rows: a schema check, never run)
            return Frame(frame.df.observe(ROWS_METRIC + node.name, *metrics), frame.time)
        observation = Observation(ROWS_METRIC + node.name)
        self.observations[node.name] = observation
        return Frame(frame.df.observe(observation, *metrics), frame.time)


def _counted_here(comp: "Compilation", node: Node) -> bool:
    """Whether to count ``node``'s rows in the query. A job's only source is not: Spark's report
    has its rows and its largest event time already, and a count right after the source would
    split the native steps behind it from Spark's generated code (0.80x -> 0.88x of the
    uncounted Yahoo pipeline, docs/dashboard.md)."""
    return not (isinstance(node, SourceNode) and len(comp.graph.sources) == 1)


def main_output(combined: Frame) -> Frame:
    """The main stream of a step that also has side outputs."""
    from pyspark.sql import functions as F

    df = combined.df
    main = [c for c in df.columns if c != TAG and not c.startswith(SIDE_PREFIX)]
    return Frame(df.filter(F.col(TAG).isNull()).select(*main), combined.time)


def _spark_message(exc: Exception) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:800]

