"""``ember bench report``: the whole suite, one Markdown report with tables and PNG plots.

Runs every registered workload against its same-run baseline, the E3 knob sweep,
the max-sustainable-rate search on the grouping job and, in subprocesses, the
grouping job on ``local[1]`` (pinned to one core with ``taskset``: Spark's own
threads would otherwise use the other) and ``local[2]``; shows progress while it runs and
writes ``report.md``, ``report.json`` and the plots into one directory. Sizes:
``quick`` (a few minutes, for a smoke of the whole path) and ``full`` (the figures
BENCHMARKS.md quotes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["SIZES", "PUBLISHED_PER_CORE", "run_report", "write_report"]


@dataclass(frozen=True)
class Size:
    duration_s: float
    rounds: int
    warmup_s: float
    max_events_per_batch: int
    sweep_duration_s: float
    sweep_triggers_ms: tuple[int, ...]
    sweep_bounds: tuple[int, ...]
    max_rate_steps: int
    scaling_duration_s: float
    sweep_targets_ms: tuple[int, ...] = ()


SIZES = {
    "tiny": Size(3, 1, 0, 40_000, 3, (0, 500), (5_000, 400_000), 1, 4, (500,)),
    "quick": Size(6, 1, 0, 1_000_000, 5, (0, 1000), (5_000, 100_000, 2_000_000), 2, 6, (250, 1000)),
    "full": Size(20, 3, 8, 2_000_000, 15, (0, 100, 250, 500, 1000, 2000),
                 (5_000, 20_000, 100_000, 500_000, 2_000_000, 4_000_000), 5, 20, (100, 250, 500, 1000)),
}

# The seeds' published throughput per core (WORKLOADS.md), for the workloads that have one.
PUBLISHED_PER_CORE = {
    "grep": ("Flink", 1_500_000),
    "grouping": ("Flink", 720_000),
    "yahoo": ("Flink, generator in the job", 375_000),
}


def _log(msg: str) -> None:
    print(f"[ember report] {msg}", file=sys.stderr, flush=True)


def run_report(size: str = "quick", master: str = "local[*]", workloads: list[str] | None = None,
               peers: bool = False) -> dict[str, Any]:
    """Run the suite at ``size``; returns everything the report shows. ``peers``: also
    ``ember bench peers`` at the size's event counts (Bytewax and PyFlink installed into their
    own virtualenvs on first use), last."""
    from ember.bench.harness import BenchConfig, bench_session
    from ember.bench.suite import WORKLOADS, run_benchmark
    from ember.bench.sustainable import find_max_rate
    from ember.bench.sweep import run_sweep
    from ember.connectors.external import require_extra

    require_extra("ember bench report", "matplotlib", "bench")  # before an hour of runs, not after
    s = SIZES[size]
    names = workloads or sorted(WORKLOADS)
    started = time.monotonic()
    spark = bench_session(master)
    cores = spark.sparkContext.defaultParallelism
    out: dict[str, Any] = {
        "size": size, "cores": cores, "workloads": {},
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} {os.cpu_count()} cpus {platform.machine()} Python {platform.python_version()}",
    }
    steps = len(names) + 3
    for i, name in enumerate(names):
        _log(f"{i + 1}/{steps} {name} ({s.rounds} x {s.duration_s:g} s each side) [{time.monotonic() - started:.0f} s]")
        cfg = BenchConfig(duration_s=s.duration_s, rounds=s.rounds, warmup_s=s.warmup_s, verbose=False,
                          max_events_per_batch=s.max_events_per_batch, master=master,
                          options=_options(name, size))
        report = run_benchmark(name, cfg, _command(name, s, size))
        out["workloads"][name] = report
        _log(f"   {report['events_per_second']:,} events/s, verified={report['verified']}"
             + (f", baseline {report['baseline_events_per_second']:,}" if "baseline_events_per_second" in report else ""))
    _log(f"{len(names) + 1}/{steps} knob sweep (E3) [{time.monotonic() - started:.0f} s]")
    out["sweep"] = run_sweep(duration_s=s.sweep_duration_s, master=master, triggers_ms=s.sweep_triggers_ms,
                             batch_bounds=s.sweep_bounds, verbose=False, targets_ms=s.sweep_targets_ms)
    out["sweep"]["command"] = f"ember bench sweep --duration {s.sweep_duration_s:g}"
    _log(f"{len(names) + 2}/{steps} max sustainable rate, grouping [{time.monotonic() - started:.0f} s]")
    cfg = BenchConfig(duration_s=max(s.duration_s, 6), max_events_per_batch=s.max_events_per_batch, master=master, verbose=False)
    out["max_rate"] = find_max_rate("grouping", WORKLOADS["grouping"][0], spark, cfg, steps=s.max_rate_steps)
    out["max_rate"]["command"] = f"ember bench grouping --max-rate --duration {max(s.duration_s, 6):g}"
    _log(f"{len(names) + 3}/{steps} scaling: grouping on local[1] and local[2] [{time.monotonic() - started:.0f} s]")
    out["scaling"] = {m: _subprocess_bench("grouping", m, s) for m in ("local[1]", "local[2]")}
    if peers:
        from ember.bench.peers.runner import SIZED, PeersConfig, run_peers

        events, python_events, latency_s = SIZED[size]
        _log(f"peers: Ember, Bytewax and PyFlink on {events:,} events [{time.monotonic() - started:.0f} s]")
        out["peers"] = run_peers(PeersConfig(events=events, python_events=python_events, latency_seconds=latency_s,
                                             stop_spark=False))
        out["peers"]["command"] = f"ember bench peers --events {events} --python-events {python_events} --latency-seconds {latency_s:g}"
    out["seconds"] = round(time.monotonic() - started)
    return out


def _options(name: str, size: str) -> dict[str, Any]:
    """yahoo-redis's 10 s windows close only in full-size runs; shorter ones use 1 s windows."""
    if name == "yahoo-redis" and size != "full":
        return {"window_ms": 1_000}
    return {}


def _command(name: str, s: Size, size: str = "full") -> str:
    window = _options(name, size).get("window_ms")
    return (f"ember bench {name} --duration {s.duration_s:g} --rounds {s.rounds} --warmup {s.warmup_s:g} "
            f"--max-events-per-batch {s.max_events_per_batch}" + (f" --window-ms {window}" if window else "") + " --json")


def _subprocess_bench(name: str, master: str, s: Size) -> dict[str, Any]:
    """One workload in a fresh process (a session's master cannot change in-process)."""
    cmd = [sys.executable, "-m", "ember.cli", "bench", name, "--master", master, "--duration", f"{s.scaling_duration_s:g}",
           "--warmup", "5", "--no-baseline", "--max-events-per-batch", str(s.max_events_per_batch), "--json"]
    if master == "local[1]" and shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]  # the whole process on one core, not just one task slot
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"], "command": " ".join(cmd)}
    report = json.loads(done.stdout.strip().splitlines()[-1])
    shown = cmd[cmd.index("bench"):]
    report["command"] = ("taskset -c 0 " if cmd[0] == "taskset" else "") + "ember " + " ".join(shown)
    return report


# --------------------------------------------------------------------------- writing
def write_report(data: dict[str, Any], directory: str) -> str:
    """``report.md``, ``report.json`` and PNG plots in ``directory``; returns the .md path."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "report.json"), "w") as f:
        json.dump(data, f, indent=1)
    plots = _plots(data, directory)
    cores = data["cores"]
    lines = [
        "# Ember benchmark report", "",
        f"{data['date']}, {data['machine']}, `local[*]` = {cores} cores, size `{data['size']}` "
        f"({data.get('seconds', 0)} s to run). Every Ember figure is verified against the generator "
        "(`verified`); baselines ran in the same process, rounds alternating.", "",
        "## Throughput per workload", "",
        "| workload | Ember events/s | per core | baseline (same run) | ratio | published per core | verified | peak RSS | command |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in data["workloads"].items():
        base = r.get("baseline_events_per_second")
        pub = PUBLISHED_PER_CORE.get(name)
        lines.append(
            f"| {name} | {r['events_per_second']:,} | {r['events_per_second'] // cores:,} | "
            f"{f'{base:,}' if base else '-'} | {r.get('ratio_to_baseline') or '-'} | "
            f"{f'{pub[1]:,} ({pub[0]})' if pub else '-'} | {r['verified']} | {r.get('peak_rss_mb', '-')} MB | `{r['command']}` |"
        )
    lines += ["", "Baselines: grep, grouping and yahoo = the same pipeline hand-written in PySpark; yahoo-json = "
              "PySpark's `from_json` pipeline on the same JSON texts"
              + (f" (on texts made by `to_json` in the JVM, as in BASELINES.md: "
                 f"{data['workloads']['yahoo-json']['to_json_baseline_events_per_second']:,} events/s)"
                 if data["workloads"].get("yahoo-json", {}).get("to_json_baseline_events_per_second") else "")
              + "; the keyed and windowed workloads = Spark's own `transformWithStateInPandas` doing the same job.", ""]
    lat = [(n, r["latency_ms"]) for n, r in data["workloads"].items() if r.get("latency_ms")]
    if lat:
        lines += ["## Latency", "", "| workload | p50 | p90 | p95 | p99 |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {v['p50']:,.0f} ms | {v['p90']:,.0f} ms | {v['p95']:,.0f} ms | {v['p99']:,.0f} ms |" for n, v in lat]
        lines.append("")
    sweep = data["sweep"]
    lines += ["## E3: the latency / throughput knob (grouping job)", "",
              f"`{sweep['command']}`: at a fixed open-loop rate of {sweep['rate']:,.0f} events/s across trigger "
              "intervals, and at unbounded rate across per-batch bounds. Max-rate throughput range: "
              f"{sweep['max_rate_throughput_range']}x.", "",
              "| sweep | trigger | events/batch <= | events/s | p50 | p90 | p99 | verified |", "|---|---|---|---|---|---|---|---|"]
    for kind in ("fixed_rate", "max_rate"):
        for p in sweep[kind]:
            q = p["latency_ms"] or {}
            lines.append(f"| {kind} | {p['trigger_interval_ms']} ms | {p['max_events_per_batch']:,} | {p['events_per_second']:,} | "
                         f"{q.get('p50', 0):,.0f} ms | {q.get('p90', 0):,.0f} ms | {q.get('p99', 0):,.0f} ms | {p['verified']} |")
    if sweep.get("latency_targets"):
        lines += ["", "Ember's buffer timeout, `StreamEnvironment(latency_target=...)` (`ember bench sweep --targets ...`), "
                  "at unbounded rate: the bound adapts at run time; a record's latency here is its batch's duration, "
                  "which the knob keeps under ~half the target (the rest is an open-loop record's wait for its batch). "
                  "Flink's published buffer-timeout points (WORKLOADS.md E3): "
                  + "; ".join(f"timeout {f['timeout_ms']} ms: {f['events_per_second_per_core']:,} events/s per core, p99 "
                              f"{f['p99_ms']} ms" for f in sweep.get("flink_buffer_timeout", [])) + ".", "",
                  "| latency target | events/s | events/s per core | p50 | p99 | bound (median) | verified |",
                  "|---|---|---|---|---|---|---|"]
        for p in sweep["latency_targets"]:
            q = p["latency_ms"] or {}
            if p.get("below_floor"):
                lines.append(f"| {p['target_ms']} ms | below the floor: {p['below_floor']} | | | | | {p['verified']} |")
                continue
            lines.append(f"| {p['target_ms']} ms | {p['events_per_second']:,} | {p['events_per_second'] // max(1, data['cores']):,} | "
                         f"{q.get('p50', 0):,.0f} ms | {q.get('p99', 0):,.0f} ms | {p['median_bound']:,} | {p['verified']} |")
    mr = data["max_rate"]
    lines += ["", "## Max sustainable throughput (grouping)", "",
              f"`{mr['command']}`: drains a backlog at {mr['drain_events_per_second']:,} events/s; sustains "
              f"**{mr['max_sustainable_events_per_second']:,} events/s** open loop (backlog after every steady batch "
              f"<= {mr['backlog_bound_s']:g} s of input). Probes: "
              + ", ".join(f"{t['rate']:,} {'ok' if t['sustained'] else 'no'}" for t in mr["trials"]) + ".", "",
              "## Scaling: grouping on 1 and 2 cores", "", "| master | events/s | command |", "|---|---|---|"]
    for master, r in data["scaling"].items():
        eps = f"{r['events_per_second']:,}" if "events_per_second" in r else f"failed: {r.get('error')}"
        lines.append(f"| {master} | {eps} | `{r.get('command', '')}` |")
    if data.get("peers"):
        from ember.bench.peers.runner import markdown

        peers = data["peers"]
        lines += ["", "## Peers side by side", "",
                  f"`{peers.get('command', 'ember bench peers')}`: the same keyed running count and 1 s event-time tumbling "
                  f"count on the same events ({peers['keys']} keys) on Ember, " + ", ".join(peers.get("packages", {}).values())
                  + "; events/s is the slope between a run of 1/5 of the events and the full run (start-up cancels), every "
                  "row verified against the events.", ""] + markdown(peers)
    lines += ["", "## Plots", ""] + [f"![{title}]({file})" for title, file in plots] + [""]
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _plots(data: dict[str, Any], directory: str) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cores = data["cores"]
    made = []
    names = list(data["workloads"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = range(len(names))
    ember = [data["workloads"][n]["events_per_second"] / cores for n in names]
    base = [(data["workloads"][n].get("baseline_events_per_second") or 0) / cores for n in names]
    pub = [PUBLISHED_PER_CORE.get(n, (None, 0))[1] for n in names]
    width = 0.27
    ax.bar([i - width for i in x], ember, width, label="Ember")
    ax.bar(list(x), base, width, label="same-run baseline (PySpark / TWS)")
    ax.bar([i + width for i in x], pub, width, label="published (Flink, per core)")
    ax.set_xticks(list(x), names, rotation=30, ha="right")
    ax.set_ylabel("events/s per core")
    ax.set_yscale("log")
    ax.set_title(f"Throughput per core ({data['machine']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "throughput.png"), dpi=110)
    plt.close(fig)
    made.append(("throughput per core", "throughput.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, marker in (("max_rate", "o"), ("fixed_rate", "s")):
        pts = [p for p in data["sweep"][kind] if p["latency_ms"]]
        for q, style in (("p50", "-"), ("p99", "--")):
            ax.plot([p["events_per_second"] / cores for p in pts], [p["latency_ms"][q] for p in pts], style, marker=marker,
                    label=f"{kind.replace('_', ' ')} {q}")
        for p in pts:  # which setting each point is
            knob = f"{p['trigger_interval_ms']} ms" if kind == "fixed_rate" else f"{p['max_events_per_batch']:,}/batch"
            ax.annotate(knob, (p["events_per_second"] / cores, p["latency_ms"]["p50"]), fontsize=7,
                        textcoords="offset points", xytext=(4, -10))
    targets = [p for p in data["sweep"].get("latency_targets", []) if p["latency_ms"]]
    if targets:
        ax.plot([p["events_per_second"] / cores for p in targets], [p["latency_ms"]["p99"] for p in targets], "-", marker="^",
                label="latency target p99 (Ember's buffer timeout)")
        for p in targets:
            ax.annotate(f"target {p['target_ms']} ms", (p["events_per_second"] / cores, p["latency_ms"]["p99"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    flink = data["sweep"].get("flink_buffer_timeout", [])
    if flink:
        ax.plot([f["events_per_second_per_core"] for f in flink], [f["p99_ms"] for f in flink], ":", marker="x", color="black",
                label="Flink p99, published (buffer timeout)")
        for f in flink:
            ax.annotate(f"Flink timeout {f['timeout_ms']} ms", (f["events_per_second_per_core"], f["p99_ms"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    ax.set_xscale("log")
    ax.set_xlabel("events/s per core")
    ax.set_ylabel("latency (ms)")
    ax.set_title("E3: latency vs throughput across trigger interval, batch bound and latency target", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "knob.png"), dpi=110)
    plt.close(fig)
    made.append(("latency vs throughput (E3)", "knob.png"))
    return made
