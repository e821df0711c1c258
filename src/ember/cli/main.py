"""``ember run | explain | bench | savepoint | produce | chaos | cluster``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shlex
import sys
from typing import Any, Callable

from ember.errors import ConfigError, EmberError
from ember.job import DASHBOARD_PORT

__all__ = ["main", "load_job"]


def load_job(target: str) -> Callable[[Any], Any]:
    """``path/to/file.py[:attr]`` or ``package.module[:attr]`` -> the function that
    declares the pipeline on an environment (``attr`` defaults to ``build``)."""
    spec, _, attr = target.partition(":")
    attr = attr or "build"
    if spec.endswith(".py") or os.path.sep in spec:
        if not os.path.exists(spec):
            raise EmberError(f"job file {spec!r} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"ember_job_{abs(hash(spec))}", spec)
        if module_spec is None or module_spec.loader is None:
            raise EmberError(f"cannot load job file {spec!r}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(spec)
        except ImportError as exc:
            raise EmberError(f"cannot import job module {spec!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise EmberError(f"{spec!r} has no function {attr!r}; a job module defines build(env) that declares the pipeline")
    return fn


def _env_from(args: argparse.Namespace) -> Any:
    from ember.api.environment import StreamEnvironment

    kwargs: dict[str, Any] = {"master": args.master}
    if getattr(args, "checkpoint_dir", None):
        kwargs["checkpoint_dir"] = args.checkpoint_dir
    if getattr(args, "trigger", None) is not None:
        kwargs["trigger_interval"] = args.trigger
    if getattr(args, "max_events_per_batch", None):
        kwargs["max_events_per_batch"] = args.max_events_per_batch
    if getattr(args, "parallelism", None):
        kwargs["parallelism"] = args.parallelism
    if getattr(args, "state_layout", None):
        kwargs["state_layout"] = args.state_layout
    if getattr(args, "latency_target_ms", None) is not None:
        kwargs["latency_target"] = args.latency_target_ms
    if getattr(args, "max_parallelism", None) is not None:
        kwargs["max_parallelism"] = args.max_parallelism
    return StreamEnvironment(**kwargs)


def _cmd_run(args: argparse.Namespace) -> int:
    build = load_job(args.target)
    env = _env_from(args)
    build(env)
    name = args.name or os.path.splitext(os.path.basename(args.target.partition(":")[0]))[0].replace(".", "-")
    result = env.execute(
        name, duration_s=args.duration, max_events=args.max_events, stop_when_idle_s=args.stop_when_idle,
        from_savepoint=args.from_savepoint, ui=args.ui_port if args.ui else False, ui_host=args.ui_host,
        ui_linger_s=args.ui_linger, standby=args.standby,
    )
    print(result.summary())
    return 0


def ui_options(parser: argparse.ArgumentParser) -> None:
    """``--ui``, ``--ui-port``, ``--ui-host``: the live dashboard (docs/dashboard.md)."""
    parser.add_argument("--ui", action="store_true", help=f"serve a live dashboard of the job (default http://127.0.0.1:{DASHBOARD_PORT}/)")
    parser.add_argument("--ui-port", type=int, default=DASHBOARD_PORT, metavar="PORT",
                        help=f"--ui: port (default {DASHBOARD_PORT}; 0 = any free port)")
    parser.add_argument("--ui-host", metavar="ADDR",
                        help="--ui: address to serve on (default 127.0.0.1; another one serves the page without authentication)")


def _checkpoint_of(job: str, checkpoint_dir: str | None) -> str:
    """A job name (under the checkpoint root) or a checkpoint directory -> the checkpoint."""
    if os.path.isdir(os.path.join(job, "offsets")) or os.path.isdir(os.path.join(job, "ember")):
        return job
    root = checkpoint_dir or os.path.join(os.getcwd(), "ember-checkpoints")
    path = os.path.join(root, job)
    if not os.path.isdir(path):
        raise EmberError(f"no job {job!r}: {path} does not exist (give --checkpoint-dir, or the checkpoint's path)")
    return path


def _cmd_savepoint(args: argparse.Namespace) -> int:
    from ember import savepoints as sp

    def say(m):
        return (print(f"[ember] {m}", file=sys.stderr, flush=True))
    if args.action == "create":
        point = sp.create_savepoint(
            _checkpoint_of(args.job, args.checkpoint_dir), args.out, root=args.dir, stop=args.stop,
            timeout_s=args.timeout, progress=say,
        )
        print(point.path)
    elif args.action == "list":
        found = sp.list_savepoints(args.dir)
        if not found:
            print(f"no savepoints in {os.path.abspath(args.dir)}")
        for s in found:
            print(f"{s.created}  {s.job:20} batch {s.batch_id:>6}  {s.partitions} partition(s)  {s.size_bytes:>12,} B  {s.path}")
    elif args.action == "inspect":
        point = sp.Savepoint(args.path)
        spark = None if args.no_state else _session(args.master)
        print(point.describe(spark))
        if args.state:
            frame = point.read_state(args.state, spark or _session(args.master))
            print(frame.to_string(max_rows=args.rows))
    elif args.action == "delete":
        sp.delete_savepoint(args.path)
        print(f"deleted {args.path}")
    return 0


def _session(master: str) -> Any:
    from ember.api.environment import StreamEnvironment

    return StreamEnvironment(master=master).spark


def _cmd_explain(args: argparse.Namespace) -> int:
    build = load_job(args.target)
    env = _env_from(args)
    build(env)
    print(env.explain(spark_plan=not args.graph_only))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from ember.bench.harness import BenchConfig
    from ember.bench.suite import run_benchmark

    if args.workers is not None and (args.workload in ("sweep", "report") or args.max_rate):
        raise ConfigError("bench: --workers runs one workload on a cluster (not sweep, report or --max-rate)")
    if args.targets and args.workload != "sweep":
        raise ConfigError("bench: --targets is the latency-target sweep's (ember bench sweep --targets 100,250,...)")
    peers_only = [f for f, v in (("--events", args.events), ("--systems", args.systems), ("--python-events", args.python_events),
                                 ("--latency-rate", args.latency_rate), ("--latency-seconds", args.latency_seconds)) if v is not None]
    if args.peers and args.workload != "report":
        raise ConfigError("bench: --peers belongs to ember bench report (or run ember bench peers)")
    if peers_only and args.workload != "peers":
        raise ConfigError(f"bench: {', '.join(peers_only)} belong to ember bench peers")
    if args.workload == "peers":
        return _cmd_peers(args)
    if args.workload == "sweep":
        return _cmd_sweep(args)
    if args.workload == "report":
        return _cmd_report(args)
    if args.max_rate:
        return _cmd_max_rate(args)
    cfg = BenchConfig(
        duration_s=args.duration, rate=args.rate, rounds=args.rounds,
        max_events_per_batch=args.max_events_per_batch, master=args.master,
        baseline=not args.no_baseline, verbose=True, warmup_s=args.warmup,
        options={k: v for k, v in (("pattern", args.pattern), ("keys", args.keys), ("window_ms", args.window_ms),
                                   ("skew", args.skew), ("state_layout", args.state_layout),
                                   ("prefill", args.prefill), ("drop_copies", args.drop_copies),
                                   ("step", args.step), ("max_parallelism", args.max_parallelism)) if v},
    )
    if args.drop_copies and not (args.prefill and args.state_layout == "delta"):
        raise ConfigError("bench: --drop-copies goes with --prefill --state-layout delta")
    command = "ember " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.workers:
        report = _bench_on_cluster(args, cfg, command)
    else:
        report = run_benchmark(args.workload, cfg, command)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:28} {value}")
    return 0 if report.get("verified") is not False else 1


def _bench_on_cluster(args: argparse.Namespace, cfg: Any, command: str) -> dict[str, Any]:
    """The benchmark on a standalone cluster of ``--workers`` workers (1 core each) started
    on loopback for it; the report says where the delta layout's state buckets ran."""
    from dataclasses import replace

    from ember.bench.harness import bench_session
    from ember.bench.suite import run_benchmark
    from ember.tools.cluster import LocalCluster, wait_for_executors

    if args.master != "local[*]":
        raise ConfigError("bench: --workers starts its own cluster; leave --master out")
    print(f"[ember bench] starting a standalone master and {args.workers} worker(s) of 1 core on 127.0.0.1",
          file=sys.stderr, flush=True)
    with LocalCluster(workers=args.workers, cores=1) as cluster:
        wait_for_executors(bench_session(cluster.url), args.workers)
        bench_session(cluster.url)  # one shuffle (state) partition per core, now that every executor is there
        report = run_benchmark(args.workload, replace(cfg, master=cluster.url), command)
        report["workers"] = args.workers
        if args.state_layout == "delta":
            report["state_buckets_by_worker"] = cluster.state_copies()
    return report


def _cmd_report(args: argparse.Namespace) -> int:
    from ember.bench.report import run_report, write_report

    data = run_report(size=args.size, master=args.master, peers=args.peers)
    data["command"] = "ember " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    path = write_report(data, args.out)
    print(f"report: {path}")
    ok = all(r.get("verified") is not False for r in data["workloads"].values()) and data["sweep"]["verified"]
    return 0 if ok else 1


def _cmd_max_rate(args: argparse.Namespace) -> int:
    import datetime as dt

    from ember.bench.harness import BenchConfig, bench_session
    from ember.bench.suite import WORKLOADS
    from ember.bench.sustainable import find_max_rate

    if args.workload not in WORKLOADS:
        raise SystemExit(f"unknown workload {args.workload!r}; available: {', '.join(sorted(WORKLOADS))}")
    cfg = BenchConfig(duration_s=args.duration, max_events_per_batch=args.max_events_per_batch, master=args.master,
                      verbose=True, options={k: v for k, v in (("keys", args.keys),) if v})
    report = find_max_rate(args.workload, WORKLOADS[args.workload][0], bench_session(args.master), cfg)
    report["command"] = "ember " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{args.workload}: drains at {report['drain_events_per_second']:,} events/s; sustains "
              f"{report['max_sustainable_events_per_second']:,} events/s open loop (backlog <= "
              f"{report['backlog_bound_s']:g} s of input); verified: {report['verified']}")
    return 0 if report["verified"] else 1


def _cmd_peers(args: argparse.Namespace) -> int:
    from ember.bench.peers.runner import PEER_PACKAGES, PeersConfig, run_peers

    cfg = PeersConfig(master="local[2]" if args.master == "local[*]" else args.master)
    if args.events is not None:
        cfg.events = _positive("--events", args.events)
    if args.keys is not None:
        cfg.keys = _positive("--keys", args.keys)
    if args.python_events is not None:
        cfg.python_events = _positive("--python-events", args.python_events)
    if args.latency_rate is not None:
        cfg.latency_rate = _positive("--latency-rate", args.latency_rate)
    if args.max_parallelism is not None:
        cfg.max_parallelism = _positive("--max-parallelism", args.max_parallelism)
    if args.latency_seconds is not None:
        if args.latency_seconds <= 0:
            raise ConfigError("bench peers: --latency-seconds must be > 0")
        cfg.latency_seconds = args.latency_seconds
    if args.systems is not None:
        systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
        unknown = sorted(set(systems) - {"ember", *PEER_PACKAGES})
        if not systems or unknown:
            raise ConfigError(f"bench peers: --systems takes a list of ember, {', '.join(PEER_PACKAGES)} (got {args.systems!r})")
        cfg.systems = systems
    report = run_peers(cfg)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'system':8} {'job':72} {'events':>11} {'events/s':>11}  verified")
        for r in report["throughput"]:
            eps = f"{r['events_per_second']:,}" if r["events_per_second"] else "n/a"
            print(f"{r['system']:8} {r['job']:72} {r['events']:>11,} {eps:>11}  {r['verified']}")
        print(f"\nlatency, paced at {cfg.latency_rate:,} events/s for {cfg.latency_seconds:.0f} s:")
        print(f"{'system':8} {'job':50} {'p50 ms':>8} {'p99 ms':>8}  verified")
        for r in report["latency"]:
            lat = r["latency_ms"]
            print(f"{r['system']:8} {r['job']:50} {lat.get('p50', 'n/a'):>8} {lat.get('p99', 'n/a'):>8}  {r['verified']}")
    return 0 if report["verified"] else 1


def _positive(flag: str, value: int) -> int:
    if value <= 0:
        raise ConfigError(f"bench peers: {flag} must be > 0, got {value}")
    return value


def _cmd_sweep(args: argparse.Namespace) -> int:
    import datetime as dt

    from ember.bench.sweep import run_sweep

    if args.targets:
        try:
            targets = tuple(int(t) for t in args.targets.split(","))
        except ValueError:
            raise ConfigError(f"--targets takes milliseconds separated by commas (e.g. 100,250,500), got {args.targets!r}") from None
        if any(t <= 0 for t in targets):
            raise ConfigError(f"--targets must be positive milliseconds, got {args.targets!r}")
        report = run_sweep(duration_s=args.duration, master=args.master, triggers_ms=(), batch_bounds=(), targets_ms=targets,
                           target_cap=args.max_events_per_batch, baseline=False)
    else:
        report = run_sweep(rate=args.rate or 500_000, duration_s=args.duration, master=args.master, baseline=not args.no_baseline)
    report["command"] = "ember " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'sweep':10} {'trigger ms':>10} {'events/batch':>12} {'events/s':>12} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}  verified")
        for sweep in ("fixed_rate", "max_rate"):
            for p in report[sweep]:
                lat = p["latency_ms"] or {}
                print(f"{sweep:10} {p['trigger_interval_ms']:>10} {p['max_events_per_batch']:>12,} {p['events_per_second']:>12,} "
                      f"{lat.get('p50', 0):>8,.0f} {lat.get('p90', 0):>8,.0f} {lat.get('p99', 0):>8,.0f}  {p['verified']}")
                if "baseline_latency_ms" in p:
                    base = p["baseline_latency_ms"] or {}
                    print(f"{'  PySpark':10} {'':>10} {'':>12} {p['baseline_events_per_second']:>12,} "
                          f"{base.get('p50', 0):>8,.0f} {base.get('p90', 0):>8,.0f} {base.get('p99', 0):>8,.0f}")
        for p in report["latency_targets"]:
            lat = p["latency_ms"] or {}
            what = p.get("below_floor") or (f"{p['events_per_second']:>12,} events/s, p50 {lat.get('p50', 0):,.0f} ms, "
                                            f"p99 {lat.get('p99', 0):,.0f} ms, bound ~{p['median_bound']:,}")
            print(f"target {p['target_ms']:>6} ms: {what}  {p['verified']}")
        if report["max_rate"]:
            print(f"max-rate throughput range: {report['max_rate_throughput_range']}x")
        print(f"verified: {report['verified']}")
    return 0 if report["verified"] else 1


def _cmd_produce(args: argparse.Namespace) -> int:
    from ember.tools.produce import ProduceConfig, main_produce

    if not args.to.startswith(("redis://", "rediss://", "unix://")):
        raise EmberError(f"--to must be a Redis URL (redis://host:port[/db]), got {args.to!r}")
    cfg = ProduceConfig(
        args.workload, url=args.to, prefix=args.prefix, partitions=args.partitions,
        rate=None if args.rate == 0 else args.rate, events=args.events, duration_s=args.duration,
        seed=args.seed, invalid_rate=args.invalid_rate,
    )
    main_produce(cfg, args.json)
    return 0


def _cmd_chaos(args: argparse.Namespace) -> int:
    from ember.tools.chaos import ChaosConfig, run_chaos

    cfg = ChaosConfig(
        args.workload, kills=args.kills, duration_s=args.duration, rate=args.rate, partitions=args.partitions,
        batch=args.batch, master=args.master, cluster=args.cluster, workers=args.workers,
        state_layout=args.state_layout or "blob", seed=args.seed, keep=args.keep, standby=args.standby,
        verbose=not args.json, ui_port=args.ui_port if args.ui else None, ui_host=args.ui_host,
    )
    report = run_chaos(cfg)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:20} {value}")
    return 0 if report.get("verified") else 1


def _cmd_cluster(args: argparse.Namespace) -> int:
    import signal
    import time

    from ember.tools.cluster import LocalCluster

    cluster = LocalCluster(workers=args.workers, cores=args.cores, memory=args.memory, work_dir=args.work_dir)
    print(f"[ember cluster] starting a master and {args.workers} worker(s) on 127.0.0.1 ...", file=sys.stderr, flush=True)
    with cluster:
        print(cluster.url, flush=True)
        print(f"[ember cluster] up: run jobs with --master {cluster.url}; master UI http://127.0.0.1:{cluster.ui_port}; "
              f"Ctrl-C stops it", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("[ember cluster] stopping", file=sys.stderr, flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember", description="Exactly-once, event-time stream processing on Spark")
    sub = p.add_subparsers(dest="command", required=True)

    def job_options(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("target", help="path/to/job.py[:build] or package.module[:build]")
        sp.add_argument("--master", default="local[*]", help="Spark master (default: embedded local[*])")
        sp.add_argument("--checkpoint-dir", help="checkpoint root (default ./ember-checkpoints)")
        sp.add_argument("--trigger", type=int, metavar="MS", help="trigger interval in ms (default 0: back to back)")
        sp.add_argument("--max-events-per-batch", type=int, help="admission-control bound per micro-batch")
        sp.add_argument("--parallelism", type=int, help="state partitions")
        sp.add_argument("--max-parallelism", type=int, metavar="N",
                        help="state buckets keys are spread over (fixed by the job's first run; default: the checkpoint's or "
                             "savepoint's, for a new job 128 or 1.5x a parallelism above 85)")
        sp.add_argument("--state-layout", choices=["blob", "delta"],
                        help="keyed state per bucket: one value (blob, default) or a log of changed rows (delta)")

    run = sub.add_parser("run", help="run a job until its sources end, a duration, or Ctrl-C")
    job_options(run)
    run.add_argument("--latency-target-ms", type=int, metavar="MS",
                     help="Ember's buffer timeout: adapt the per-batch bound to keep latency under MS (Ember's sources)")
    run.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    run.add_argument("--max-events", type=int, help="stop after this many events")
    run.add_argument("--stop-when-idle", type=float, metavar="S", help="stop once no input arrived for S seconds (drain, then stop)")
    run.add_argument("--name", help="job name (checkpoint subdirectory); default: the file name")
    run.add_argument("--from-savepoint", metavar="PATH",
                     help="start from a savepoint (a new job name: its checkpoint must be new); with --parallelism, rescale; "
                          "with another --state-layout, convert its keyed state")
    run.add_argument("--standby", action="store_true",
                     help="if the job already runs: start this driver and wait; take over at once if the running one dies, "
                          "stand down if it ends by itself")
    ui_options(run)
    run.add_argument("--ui-linger", type=float, default=0.0, metavar="S",
                     help="--ui: keep serving the final state S seconds after the job ended (default 0; Ctrl-C ends it)")
    run.set_defaults(func=_cmd_run)

    save = sub.add_parser("savepoint", help="create, list, inspect or delete savepoints (docs/savepoints.md)")
    save_sub = save.add_subparsers(dest="action", required=True)
    create = save_sub.add_parser("create", help="save a job's state at its newest committed batch")
    create.add_argument("job", help="job name (under --checkpoint-dir) or checkpoint directory")
    create.add_argument("--stop", action="store_true", help="stop the running job first, at a clean cut (stop-with-savepoint)")
    create.add_argument("--checkpoint-dir", help="checkpoint root (default ./ember-checkpoints)")
    create.add_argument("--dir", default="ember-savepoints", help="savepoint root (default ./ember-savepoints)")
    create.add_argument("--out", help="exact savepoint directory (default DIR/JOB-bBATCH-TIME)")
    create.add_argument("--timeout", type=float, default=300.0, metavar="S", help="--stop: wait at most S s (default 300)")
    listing = save_sub.add_parser("list", help="the savepoints under --dir")
    listing.add_argument("--dir", default="ember-savepoints", help="savepoint root (default ./ember-savepoints)")
    inspect = save_sub.add_parser("inspect", help="verify a savepoint and show its job, cut, operators, keys and state sizes")
    inspect.add_argument("path")
    inspect.add_argument("--state", metavar="OPERATOR", help="also print this operator's state")
    inspect.add_argument("--rows", type=int, default=50, help="--state: rows shown (default 50)")
    inspect.add_argument("--no-state", action="store_true", help="skip reading state (no Spark start: files and manifest only)")
    inspect.add_argument("--master", default="local[2]", help="Spark master for reading state (default local[2])")
    delete = save_sub.add_parser("delete", help="delete a savepoint (refused for a directory that is not one)")
    delete.add_argument("path")
    save.set_defaults(func=_cmd_savepoint)

    explain = sub.add_parser("explain", help="show the Ember graph and Spark's plan")
    job_options(explain)
    explain.add_argument("--graph-only", action="store_true", help="skip Spark's plan (no Spark start)")
    explain.set_defaults(func=_cmd_explain)

    bench = sub.add_parser("bench", help="run a benchmark workload (grep, grouping, statemachine, window, countwindow, ...)")
    bench.add_argument("workload", help="grep | grouping | grouping-keyed | rolling (keyed running count, one output per key and batch) | "
                       "statemachine | statemachine-vectorized | window | "
                       "countwindow | pipeline (three stateful steps, the first two chained) | "
                       "pipeline-unchained (the same, re-keyed between them) | interval-join (impressions joined with clicks within 10 s) | "
                       "connect (E4 checked against rules changing every second: broadcast state) | "
                       "yahoo | yahoo-json (events as JSON texts) | yahoo-redis (open loop, --rate default 100,000; "
                       "counts written to Redis every second and at each window's end; latency percentiles); "
                       "peers (Ember beside Bytewax and PyFlink, each in its own virtualenv installed on first use: a keyed "
                       "running count and a 1 s event-time tumbling count over the same --events, throughput and paced latency); "
                       "sweep (E3: the grouping job across trigger intervals at --rate, "
                       "default 500,000, and across per-batch bounds at unbounded rate); report (the whole suite: "
                       "a Markdown report with tables and plots in --out)")
    bench.add_argument("--duration", type=float, default=20.0, metavar="S", help="seconds per run (default 20)")
    bench.add_argument("--rate", type=float, help="open-loop input rate, events/s (default: unbounded)")
    bench.add_argument("--rounds", type=int, default=1, help="alternating Ember/baseline rounds (default 1)")
    bench.add_argument("--max-events-per-batch", type=int, default=2_000_000)
    bench.add_argument("--master", default="local[*]")
    bench.add_argument("--workers", type=int, metavar="N",
                       help="run on a standalone cluster of N workers (1 core each) started on loopback for the run")
    bench.add_argument("--no-baseline", action="store_true", help="skip the plain-PySpark baseline")
    bench.add_argument("--warmup", type=float, default=8.0, metavar="S", help="discarded warm-up run of each side (default 8 s)")
    bench.add_argument("--pattern", help="grep: regex to match (default the E1 pattern)")
    bench.add_argument("--keys", type=int, help="grouping-keyed, rolling: distinct keys (default 1000); peers: keys (default 100)")
    bench.add_argument("--skew", action="store_true", help="grouping-keyed: Zipf-like keys (key k ~1/k as often as key 0)")
    bench.add_argument("--prefill", action="store_true",
                       help="grouping-keyed: create every key first (2 M events per batch), then measure from that checkpoint")
    bench.add_argument("--state-layout", choices=["blob", "delta"],
                       help="grouping-keyed: keyed state as one value per bucket (blob, default) or a delta log (delta)")
    bench.add_argument("--max-parallelism", type=int, metavar="N",
                       help="the jobs' state buckets (StreamEnvironment(max_parallelism=N); default 128; peers: Ember's)")
    bench.add_argument("--drop-copies", action="store_true",
                       help="grouping-keyed --prefill --state-layout delta: remove the working copies before the measured run "
                            "(its first batch rebuilds them from the log: first_batch_after_restart_s)")
    bench.add_argument("--step", choices=["vectorised", "process"],
                       help="grouping-keyed: the count as a vectorised step (default) or a per-record process function "
                            "with one waiting timer per key")
    bench.add_argument("--window-ms", type=int, help="yahoo-redis: window size in ms (default 10000, E5's)")
    bench.add_argument("--size", choices=["tiny", "quick", "full"], default="quick", help="report: run sizes (default quick)")
    bench.add_argument("--out", default="bench-report", help="report: output directory (default ./bench-report)")
    bench.add_argument("--max-rate", action="store_true",
                       help="search the highest open-loop rate the workload sustains (bounded lag), after a drain run")
    bench.add_argument("--targets", metavar="MS,MS,...",
                       help="sweep: only the latency-target sweep (Ember's buffer timeout), e.g. 100,250,500,1000")
    bench.add_argument("--peers", action="store_true",
                       help="report: also run ember bench peers (Bytewax and PyFlink, installed on first use) and include it")
    bench.add_argument("--events", type=int, help="peers: events per throughput run (default 10,000,000)")
    bench.add_argument("--python-events", type=int,
                       help="peers: events for PyFlink's Python DataStream runs (default 200,000: it runs ~10 k events/s)")
    bench.add_argument("--systems", metavar="A,B,...", help="peers: which of ember, bytewax, pyflink (default all)")
    bench.add_argument("--latency-rate", type=int, help="peers: events/s of the paced latency runs (default 2,000)")
    bench.add_argument("--latency-seconds", type=float, help="peers: seconds of each paced latency run (default 20)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(func=_cmd_bench)

    prod = sub.add_parser("produce", help="write generator events into Redis streams at a target rate")
    prod.add_argument("workload", choices=["statemachine", "yahoo"])
    prod.add_argument("--to", default="redis://127.0.0.1:6379/0", help="Redis URL (default redis://127.0.0.1:6379/0)")
    prod.add_argument("--prefix", help="streams are PREFIX:0..P-1 (default ember:WORKLOAD)")
    prod.add_argument("--partitions", type=int, default=2, help="streams (default 2)")
    prod.add_argument("--rate", type=float, default=50_000.0, help="events/s (default 50000; 0 = as fast as possible)")
    prod.add_argument("--events", type=int, help="stop after this many events")
    prod.add_argument("--duration", type=float, metavar="S", help="stop after S seconds at the rate")
    prod.add_argument("--seed", type=int, default=1)
    prod.add_argument("--invalid-rate", type=float, default=0.001, help="statemachine: injected invalid sequences (default 0.001)")
    prod.add_argument("--json", action="store_true", help="print one JSON object")
    prod.set_defaults(func=_cmd_produce)

    chaos = sub.add_parser("chaos", help="kill a running job repeatedly and verify exactly-once results")
    chaos.add_argument("workload", choices=["statemachine", "pipeline", "fanout"],
                       help="statemachine: E4; pipeline: dedupe -> state machine -> 1 s windows (three stateful steps); "
                            "fanout: dedupe -> two state machines as lanes of one operator, one per sink")
    chaos.add_argument("--kills", type=int, default=2, help="SIGKILLs (default 2): of the driver; with --cluster also of executors and workers")
    chaos.add_argument("--duration", type=float, default=60.0, metavar="S", help="seconds of production (default 60)")
    chaos.add_argument("--rate", type=float, default=10_000.0, help="events/s produced (default 10000)")
    chaos.add_argument("--partitions", type=int, default=2, help="Redis streams (default 2)")
    chaos.add_argument("--batch", type=int, default=50_000, help="records per micro-batch at most (default 50000)")
    chaos.add_argument("--master", default="local[2]", help="Spark master of the job (default local[2])")
    chaos.add_argument("--cluster", action="store_true",
                       help="start a standalone master and --workers workers on loopback, run the job there, kill executors and workers too")
    chaos.add_argument("--workers", type=int, help="--cluster: workers of 1 core each (default 2)")
    chaos.add_argument("--state-layout", choices=["blob", "delta"],
                       help="keyed state as one value per bucket (blob, default) or a delta log (delta)")
    chaos.add_argument("--standby", action="store_true",
                       help="keep a standby driver waiting beside the job (ember run --standby): it takes over a killed driver")
    chaos.add_argument("--seed", type=int, help="seed of the kill schedule (default random)")
    chaos.add_argument("--keep", action="store_true", help="keep the work directory (checkpoint, logs)")
    chaos.add_argument("--json", action="store_true", help="print one JSON object")
    ui_options(chaos)
    chaos.set_defaults(func=_cmd_chaos)

    cl = sub.add_parser("cluster", help="run a Spark standalone master and workers on loopback until Ctrl-C")
    cl.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    cl.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    cl.add_argument("--memory", default="2g", help="memory per worker (default 2g)")
    cl.add_argument("--work-dir", help="logs and executor directories (default: a temporary directory)")
    cl.set_defaults(func=_cmd_cluster)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except EmberError as exc:
        print(f"ember: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
