"""StreamEnvironment: the job's configuration and the entry point to sources and execution."""

from __future__ import annotations

import os
import re
import sys
from datetime import timedelta
from typing import Any, Callable

from ember.api.datastream import DataStream
from ember.connectors.base import Source
from ember.connectors.spark_sources import ScriptedSource
from ember.errors import ConfigError, PipelineError
from ember.graph.chaining import chained
from ember.graph.graph import Graph
from ember.graph.nodes import SinkNode, SourceNode, SqlNode
from ember.job import DASHBOARD_PORT, MAX_STATE_BUCKETS, EnvironmentConfig, JobResult, default_max_parallelism
from ember.runner.spark.planner import physical_notes, plan
from ember.time.clock import Clock, SystemClock
from ember.time.durations import seconds_of, to_ms
from ember.time.watermarks import WatermarkStrategy

# The runner's compiler and executor and the savepoints (and with them PySpark and pandas)
# are imported where a job is explained or run, not here (the planner is plain Python):
# `import ember` and declaring a pipeline stay light (0.1-0.2 s instead of 0.8 s), which the
# CLI and the Spark-free unit tests rely on.

__all__ = ["StreamEnvironment", "JobResult", "EnvironmentConfig"]

_MASTER = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://[\w.\-]+:\d+(,[\w.\-]+:\d+)*|yarn|k8s://.+)$")
_STATE_BACKENDS = ("rocksdb", "hdfs")
KEYED_OPERATORS = ("auto", "transform_with_state")
STATE_LAYOUTS = ("blob", "delta")


class StreamEnvironment:
    """Configuration of a streaming job and the factory of its sources.

    - ``master``: Spark master; default the embedded local mode on all cores.
      ``spark://host:port`` runs the same pipeline on a standalone cluster.
    - ``checkpoint_dir``: where each job keeps its checkpoint, as
      ``<checkpoint_dir>/<job name>``; a job restarted with the same name resumes.
    - ``parallelism``: number of state partitions (Spark shuffle partitions);
      default = the number of cores. Fixed by a job's first run.
    - ``trigger_interval``: time between micro-batch starts (0 = back to back).
    - ``max_events_per_batch``: admission control: the most events a source
      admits into one micro-batch. With ``trigger_interval`` this is Ember's
      latency/throughput knob (Flink's buffer timeout).
    - ``state_backend``: ``"rocksdb"`` (default, with changelog checkpointing)
      or ``"hdfs"`` (Spark's in-memory store).
    - ``combine_windows``: pre-aggregate a Python ``AggregateFunction``'s windows, and
      rolling ``sum``/``min``/``max`` with ``emit="batch"``, before the shuffle where that
      cannot change results (docs/windows.md); off = every record travels to its key's
      state partition.
    - ``fuse_sources``: a Python source (Ember's generators) right before a keyed
      step packs its records per state bucket itself, saving a pass of every
      record through the JVM (docs/design/keyed-state.md), and a JSON generator
      right before ``parse_json`` decodes its texts itself (docs/design/json.md);
      off = a separate packing / decoding step.
    - ``keyed_operator``: the Spark operator under keyed steps (process functions,
      Python windows). ``"auto"`` (default): ``applyInPandasWithState`` for a job's
      only keyed step, ``transformWithStateInPandas`` for every step of a job with
      several (Spark runs one of the former per query). ``"transform_with_state"``:
      always the latter — a job that may gain a second keyed step later keeps its
      state layout. Fixed by a job's first run (docs/design/dataflow.md).
    - ``state_layout``: how a keyed step keeps its state buckets. ``"blob"`` (default): each
      bucket's table is one value in Spark's state store, rewritten when a batch changes it.
      ``"delta"``: each bucket keeps a log of changed rows in Spark's state store and its
      table on the executor's disk, so checkpoint bytes per batch follow the keys a batch
      changed, not the state's size (docs/design/keyed-state-at-scale.md). For every
      keyed step with one input (process functions, windows on Ember's operator, rolling
      aggregations, CEP, two-input steps; ``process_batches`` with one integer key and
      numeric state). Needs ``state_backend="rocksdb"``; fixed by a job's first run.
    - ``latency_target``: Ember's buffer timeout — a timedelta (or milliseconds). The
      runner adapts the per-batch bound after every micro-batch to keep a record's time
      from its arrival to its batch's commit under the target, as large as that allows
      (the most throughput), never above ``max_events_per_batch``; a target the job
      cannot keep even with the smallest batches stops it with a
      :class:`~ember.errors.LatencyTargetError` naming the floor it measured. Needs
      Ember's own sources (generators, Redis streams) and ``trigger_interval`` 0
      (docs/design/latency.md, "The latency-target knob").
    - ``max_parallelism``: how many state buckets (Flink's key groups) keyed steps spread
      their keys over — the most state partitions a job can be rescaled to, and how many
      groups Spark hands Ember's Python operator per micro-batch. Left unset, as in Flink, a
      job continuing a checkpoint or restoring a savepoint takes the count it holds, and a new
      job 128 — or, with more than 85 state partitions, 1.5x them rounded up to a power of
      two (at most 32,768). Each bucket called costs a few ms of Spark's per-group work in a
      micro-batch, so a small job that needs low latency runs faster with fewer (e.g. 16 on
      one machine: docs/design/latency.md, "State buckets"); a job whose state is large, or
      that will be rescaled to many machines, keeps more. Fixed by a job's first run
      (a restart or savepoint given another value is refused, naming the step);
      ``parallelism`` may not exceed it.
    - ``spark``: an existing SparkSession to use instead of creating one.
    - ``spark_conf``: extra Spark settings for the session Ember creates.
    """

    def __init__(
        self,
        master: str = "local[*]",
        checkpoint_dir: str | os.PathLike[str] | None = None,
        parallelism: int | None = None,
        trigger_interval: timedelta | int = 0,
        max_events_per_batch: int = 2_000_000,
        state_backend: str = "rocksdb",
        changelog_checkpointing: bool = True,
        combine_windows: bool = True,
        fuse_sources: bool = True,
        keyed_operator: str = "auto",
        state_layout: str = "blob",
        latency_target: timedelta | int | None = None,
        max_parallelism: int | None = None,
        spark: Any = None,
        spark_conf: dict[str, str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(master, str) or not _MASTER.match(master):
            raise ConfigError(
                f"master must be local, local[N], local[*] or spark://host:port, got {master!r}"
            )
        if parallelism is not None and (not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism <= 0):
            raise ConfigError(f"parallelism must be a positive int, got {parallelism!r}")
        if not isinstance(max_events_per_batch, int) or isinstance(max_events_per_batch, bool) or max_events_per_batch <= 0:
            raise ConfigError(f"max_events_per_batch must be a positive int, got {max_events_per_batch!r}")
        if keyed_operator not in KEYED_OPERATORS:
            raise ConfigError(f"keyed_operator must be one of {', '.join(KEYED_OPERATORS)}, got {keyed_operator!r}")
        if state_layout not in STATE_LAYOUTS:
            raise ConfigError(f"state_layout must be one of {', '.join(STATE_LAYOUTS)}, got {state_layout!r}")
        if state_layout == "delta" and state_backend != "rocksdb":
            raise ConfigError("state_layout='delta' needs state_backend='rocksdb' (it runs on Spark's transformWithStateInPandas)")
        given = max_parallelism is not None
        if max_parallelism is None:
            max_parallelism = default_max_parallelism(parallelism or 1)
        elif not isinstance(max_parallelism, int) or isinstance(max_parallelism, bool) or not 1 <= max_parallelism <= MAX_STATE_BUCKETS:
            raise ConfigError(f"max_parallelism must be an int from 1 to {MAX_STATE_BUCKETS:,}, got {max_parallelism!r}")
        if parallelism is not None and parallelism > max_parallelism:
            raise ConfigError(
                f"parallelism {parallelism} is above max_parallelism {max_parallelism}: keys are spread over "
                f"max_parallelism state buckets, so at most that many state partitions can hold state"
            )
        if state_backend not in _STATE_BACKENDS:
            raise ConfigError(f"state_backend must be one of {', '.join(_STATE_BACKENDS)}, got {state_backend!r}")
        if keyed_operator == "transform_with_state" and state_backend != "rocksdb":
            raise ConfigError("keyed_operator='transform_with_state' needs state_backend='rocksdb' (Spark's requirement)")
        target_ms = None if latency_target is None else to_ms(latency_target, "latency_target")
        trigger_ms = to_ms(trigger_interval, "trigger_interval", allow_zero=True)
        if target_ms is not None and trigger_ms:
            raise ConfigError(
                f"latency_target and trigger_interval ({trigger_ms} ms) do not go together: with a latency target the "
                "batches run back to back and their size is what adapts (give trigger_interval=0)"
            )
        ckpt = os.fspath(checkpoint_dir) if checkpoint_dir is not None else os.path.join(os.getcwd(), "ember-checkpoints")
        self.config = EnvironmentConfig(
            master=master,
            checkpoint_dir=os.path.abspath(ckpt),
            parallelism=parallelism,
            trigger_interval_ms=trigger_ms,
            max_events_per_batch=max_events_per_batch,
            state_backend=state_backend,
            changelog_checkpointing=bool(changelog_checkpointing),
            spark_conf=tuple(sorted((spark_conf or {}).items())),
            combine_windows=bool(combine_windows),
            fuse_sources=bool(fuse_sources),
            keyed_operator=keyed_operator,
            state_layout=state_layout,
            latency_target_ms=target_ms,
            max_parallelism=max_parallelism,
            max_parallelism_given=given,
        )
        self._spark = spark
        self.clock = clock or SystemClock()
        self._sinks: list[SinkNode] = []
        self._counters: dict[str, int] = {}
        self._names: set[str] = set()
        self._views: dict[str, Any] = {}  # view name -> the stream's node (DataStream.create_view)
        self.dashboard: Any = None  # while execute(ui=...) runs: its ember.ui.Dashboard (.url)

    # -- graph building -----------------------------------------------------------------
    def _register_view(self, name: str, node: Any) -> None:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise PipelineError(f"a view name must be a SQL identifier (letters, digits, _), got {name!r}", "create_view")
        if name.lower() in self._views and self._views[name.lower()] is not node:
            raise PipelineError(f"a view named '{name}' exists already; view names must be unique", "create_view")
        self._views[name.lower()] = node

    def sql(self, query: str, *, rowtime: str = "rowtime", name: str | None = None) -> DataStream:
        """A stream from a Spark SQL ``query`` over the views made with
        :meth:`DataStream.create_view` (Flink's Table API interop): windows
        (``window(rowtime, '10 seconds')``), joins and aggregations with watermarks, compiled by
        Spark SQL under Spark's streaming rules (docs/sql.md). Each view has the stream's fields
        and, for a stream with event time, ``rowtime``: its timestamp as a watermarked
        ``timestamp`` column."""
        step = name or "sql"
        if not isinstance(query, str) or not query.strip():
            raise PipelineError("sql needs a query string", step)
        used = [v for v in self._views if re.search(rf"(?<![A-Za-z0-9_`]){v}(?![A-Za-z0-9_])", query, flags=re.I)]
        if not used:
            known = ", ".join(sorted(self._views)) or "none yet: stream.create_view(name)"
            raise PipelineError(f"the query reads no view (views: {known})", step)
        node = SqlNode(name=self._step_name(name, "sql"), inputs=tuple(self._views[v] for v in used),
                       query=query, views=tuple(used), rowtime=rowtime)
        return DataStream(self, node)

    def from_source(
        self, source: Source, watermark: WatermarkStrategy | None = None, *, name: str | None = None
    ) -> DataStream:
        """A stream reading ``source``. ``watermark`` chooses the stream's time:
        event time from a field, ingestion time or processing time."""
        if not isinstance(source, Source):
            raise PipelineError(f"from_source takes an Ember source (e.g. YahooSource()), got {source!r}", name or "source")
        if watermark is not None and not isinstance(watermark, WatermarkStrategy):
            raise PipelineError(f"watermark must be a WatermarkStrategy, got {watermark!r}", name or "source")
        node = SourceNode(name=self._step_name(name, "source"), source=source, watermark=watermark)
        return DataStream(self, node)

    def from_collection(
        self, rows: list[Any], schema: str, watermark: WatermarkStrategy | None = None, *, name: str | None = None
    ) -> DataStream:
        """A bounded stream of ``rows`` (tuples or dicts) in one micro-batch."""
        return self.from_source(ScriptedSource([rows], schema), watermark, name=name)

    def _step_name(self, name: str | None, prefix: str) -> str:
        if name is not None:
            if not isinstance(name, str) or not name:
                raise PipelineError(f"step names must be non-empty strings, got {name!r}")
            if name in self._names:
                raise PipelineError(f"two steps are named '{name}'; step names must be unique")
            self._names.add(name)
            return name
        while True:
            self._counters[prefix] = self._counters.get(prefix, 0) + 1
            candidate = f"{prefix}_{self._counters[prefix]}"
            if candidate not in self._names:
                self._names.add(candidate)
                return candidate

    def _register_sink(self, node: SinkNode) -> None:
        self._sinks.append(node)

    def graph(self) -> Graph:
        """The validated graph of every stream sent to a sink so far."""
        return chained(Graph(list(self._sinks)).validate())

    # -- running -----------------------------------------------------------------------
    @property
    def spark(self) -> Any:
        """The SparkSession (created on first use)."""
        if self._spark is None:
            from ember.runner.spark.session import get_or_create_session

            self._spark = get_or_create_session(self.config)
        return self._spark

    def explain(self, spark_plan: bool = True) -> str:
        """The Ember graph and, with ``spark_plan``, the Spark plan it compiles to."""
        graph = self.graph()
        text = "== Ember graph ==\n" + graph.explain(physical_notes(graph))
        if spark_plan:
            from ember.runner.spark.compiler import compile_graph

            job = compile_graph(graph, self.spark, self.config, job_name="explain", checkpoint=None)
            text += "\n\n== Spark plan ==\n" + job.spark_plan()
        return text

    def execute(
        self,
        name: str = "ember-job",
        *,
        duration: timedelta | None = None,
        max_events: int | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        progress: Callable[[dict[str, Any]], None] | bool = True,
        stop_when_idle: timedelta | None = None,
        from_savepoint: str | os.PathLike[str] | None = None,
        min_batches: int = 0,
        duration_s: float | None = None,
        stop_when_idle_s: float | None = None,
        ui: bool | int = False,
        ui_host: str | None = None,
        ui_linger_s: float = 0.0,
        standby: bool = False,
    ) -> JobResult:
        """Compile the pipeline to one Spark Structured Streaming query and run it.

        It runs until stopped (Ctrl-C), until every source has ended (bounded
        sources), until ``duration`` (a timedelta; or ``duration_s`` seconds) has
        passed, or until at least ``max_events`` events were processed, or — with
        ``stop_when_idle`` (a timedelta; or ``stop_when_idle_s``) — once no input arrived for that long and no
        source has data waiting (drain what is there, then stop) — whichever
        comes first. ``min_batches``: with ``duration``, run on until at least this
        many micro-batches have taken input (at most a minute longer) — a short
        timed run on a slow machine still measures something. ``progress``: True prints a line every few seconds to stderr; a callable
        receives each Spark progress report; False is silent.

        ``from_savepoint``: start from a savepoint (ember.savepoints) instead of
        nothing; the job's checkpoint must then be new. The savepoint is verified and
        this pipeline compared with the one that wrote it before the job starts; with
        ``parallelism`` set to another value than the savepoint's, its state is
        repartitioned first.

        ``ui``: serve a live dashboard of the job while it runs (docs/dashboard.md) —
        ``True`` on port 8081, an int on that port (0: any free one). It binds
        ``127.0.0.1`` unless ``ui_host`` names another address (served without
        authentication: a warning says so). ``ui_linger_s``: keep serving the final state
        that many seconds after the job ended.

        One driver runs a job at a time: a second ``execute`` on a checkpoint in use fails
        at once. ``standby=True`` starts this driver (JVM, Spark session, Python workers)
        and waits instead: when the running driver's process dies it takes over at once
        from the checkpoint; when that job ends by itself it stands down (README, "One
        driver per job; standby drivers"; docs/design/exactly-once.md, "Recovery time").
        """
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise ConfigError(f"job name must be letters, digits, '_', '-' or '.', got {name!r}")
        seconds = seconds_of(duration, duration_s, "duration")
        idle = seconds_of(stop_when_idle, stop_when_idle_s, "stop_when_idle")
        if not isinstance(min_batches, int) or min_batches < 0:
            raise ConfigError(f"min_batches must be an int >= 0, got {min_batches!r}")
        if max_events is not None and (not isinstance(max_events, int) or max_events <= 0):
            raise ConfigError(f"max_events must be a positive int, got {max_events!r}")
        if isinstance(ui, bool) or ui is None:
            port = DASHBOARD_PORT if ui else None
        elif isinstance(ui, int):
            port = ui
        else:
            raise ConfigError(f"ui must be True, False or a port number, got {ui!r}")
        if not isinstance(ui_linger_s, (int, float)) or ui_linger_s < 0:
            raise ConfigError(f"ui_linger_s must be a number of seconds >= 0, got {ui_linger_s!r}")
        if standby and from_savepoint is not None:
            raise ConfigError("standby and from_savepoint do not go together: a restore starts a new job, a standby "
                              "takes over a running one (restore first, then start standbys for it)")
        from ember.runner.spark.execution import leadership, stood_down

        graph = self.graph()
        plan(graph)  # what one Spark query cannot run fails here, before a checkpoint is touched
        ckpt = os.path.abspath(os.fspath(checkpoint) if checkpoint is not None else os.path.join(self.config.checkpoint_dir, name))
        with leadership(self.spark, ckpt, name, bool(standby)) as lead:  # one driver per checkpoint
            if not lead.leads:
                return stood_down(name, ckpt)
            result = self._lead(
                graph, name, ckpt, seconds=seconds, max_events=max_events, progress=progress, idle=idle,
                from_savepoint=from_savepoint, min_batches=min_batches, port=port, ui_host=ui_host, ui_linger_s=ui_linger_s,
            )
            lead.ended = result.stopped_because
            return result

    def _lead(
        self, graph: Any, name: str, ckpt: str, *, seconds: float | None, max_events: int | None,
        progress: Callable[[dict[str, Any]], None] | bool, idle: float | None, from_savepoint: Any, min_batches: int,
        port: int | None, ui_host: str | None, ui_linger_s: float,
    ) -> JobResult:
        """:meth:`execute` once this driver holds the job's checkpoint."""
        from ember.runner.spark.execution import run_job
        from ember.savepoints import restore_savepoint

        dashboard = None
        if port is not None:  # bound now: a taken port fails before the job starts
            from ember.ui import Dashboard, JobMonitor

            dashboard = Dashboard(JobMonitor(graph, name), host=ui_host or "127.0.0.1", port=port,
                                  allow_remote=ui_host is not None).start()
            print(f"[ember] {name}: dashboard at {dashboard.url}", file=sys.stderr, flush=True)
        self.dashboard = dashboard
        try:
            if from_savepoint is not None:
                restore_savepoint(
                    self.spark, os.fspath(from_savepoint), ckpt, graph, self.config.parallelism, self.config.keyed_operator,
                    self.config.state_layout, self.config.state_backend,
                    self.config.max_parallelism if self.config.max_parallelism_given else None,
                )
            return run_job(
                graph, self.spark, self.config, name=name, checkpoint=ckpt,
                duration_s=seconds, max_events=max_events, progress=progress, clock=self.clock, idle_s=idle,
                min_batches=min_batches, listener=dashboard.monitor if dashboard is not None else None,
            )
        finally:
            self._sinks.clear()
            if dashboard is not None:
                if ui_linger_s:
                    print(f"[ember] {name}: the dashboard stays at {dashboard.url} for {ui_linger_s:g} s",
                          file=sys.stderr, flush=True)
                    try:
                        self.clock.sleep(ui_linger_s)
                    except KeyboardInterrupt:
                        pass
                dashboard.stop()
                self.dashboard = None
