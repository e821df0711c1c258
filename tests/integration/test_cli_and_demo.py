"""The command line, the demo job and a tiny smoke of every benchmark."""

import os

import pytest

from ember.cli.main import main

pytestmark = pytest.mark.spark

HERE = os.path.dirname(__file__)
JOB = os.path.join(HERE, "jobs", "bounded_job.py")


def test_ember_run_executes_a_job_module(spark, tmp_path, capsys):
    code = main(["run", f"{JOB}:build", "--checkpoint-dir", str(tmp_path), "--name", "cli-job", "--master", "local[2]"])
    assert code == 0
    out = capsys.readouterr().out
    assert "job 'cli-job': 3 events" in out and "sources ended, windows flushed" in out
    assert os.path.isdir(tmp_path / "cli-job" / "offsets")


def test_ember_explain_graph_only(capsys):
    assert main(["explain", JOB, "--graph-only"]) == 0
    out = capsys.readouterr().out
    assert "window tumbling 2000 ms (event time) by k: clicks=count(*)" in out
    assert "clicks: source scripted 2 batches, 3 rows" in out


def test_cli_errors_are_clear(capsys):
    assert main(["run", "no/such/job.py"]) == 2
    assert "ember: error: job file 'no/such/job.py' does not exist" in capsys.readouterr().err
    assert main(["explain", f"{JOB}:nothing", "--graph-only"]) == 2
    assert "has no function 'nothing'" in capsys.readouterr().err
    # option combinations that would be ignored fail before anything starts
    for argv, message in (
        (["bench", "grouping-keyed", "--drop-copies"], "--drop-copies goes with --prefill --state-layout delta"),
        (["bench", "sweep", "--workers", "2"], "--workers runs one workload"),
        (["bench", "grouping", "--workers", "2", "--master", "local[2]"], "leave --master out"),
        (["chaos", "statemachine", "--workers", "4"], "--workers applies to a cluster run"),
    ):
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_demo_counts_are_exact(spark, capsys, load_example):
    demo = load_example("yahoo_campaigns")
    assert demo.main(["--seconds", "22", "--rate", "50000", "--master", "local[2]"]) == 0
    out = capsys.readouterr().out
    assert "RESULT                EXACT" in out
    assert "window latency" in out and "events processed" in out


def test_ember_run_ships_module_level_functions_to_workers(spark, tmp_path, capsys):
    job = os.path.join(HERE, "jobs", "module_function_job.py")
    assert main(["run", job, "--checkpoint-dir", str(tmp_path), "--master", "local[2]"]) == 0
    assert "job 'module_function_job': 2 events" in capsys.readouterr().out


def test_redis_postgres_example_is_exact(spark, capsys, load_example):
    example = load_example("redis_postgres")
    assert example.main(["--events", "10000", "--master", "local[2]"]) == 0
    out = capsys.readouterr().out
    assert "EXACT" in out and "dead letters: 3" in out
    assert "no match in the lookup table for ad_id = {\"ad_id\":\"no-such-ad\"}" in out


def test_demo_window_latency_leaves_out_the_windows_that_ended_during_start_up(load_example):
    from types import SimpleNamespace

    demo = load_example("yahoo_campaigns")
    start = 1_700_000_000_000
    progress = [{"batchId": i, "timestamp": f"2023-11-14T22:13:{20 + 10 * i:02d}.000Z"} for i in range(4)]
    batch2 = start + 20_000  # 2023-11-14T22:13:40Z, micro-batch 2's start
    sink = SimpleNamespace(batches=[
        SimpleNamespace(arrival_ms=batch2 + 5_000, rows=[{"window_end": start + 10_000}, {"window_end": start + 10_000}]),
        SimpleNamespace(arrival_ms=batch2 + 12_000, rows=[{"window_end": batch2 + 10_000}]),
        SimpleNamespace(arrival_ms=batch2 + 21_500, rows=[{"window_end": batch2 + 20_000}]),
    ])
    latency, left_out, since_s = demo.steady_window_latency(sink, progress, start)
    assert left_out == 2 and since_s == 20.0  # the two start-up windows waited 15 s: not the pipeline's latency
    assert latency == {"p50": 1_500.0, "p90": 2_000.0, "p95": 2_000.0, "p99": 2_000.0}
