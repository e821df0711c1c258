"""The benchmark report writer: tables for every part of the suite, plots as PNG files."""

import os

from ember.bench.report import write_report


def _data():
    lat = {"p50": 600.0, "p90": 800.0, "p95": 850.0, "p99": 900.0}
    point = {"trigger_interval_ms": 0, "max_events_per_batch": 5_000, "events_per_second": 17_000, "latency_ms": lat, "verified": True}
    big = {**point, "max_events_per_batch": 2_000_000, "events_per_second": 2_800_000}
    return {
        "size": "quick", "cores": 2, "date": "2026-11-21 23:00 UTC", "machine": "vm 2 cpus", "seconds": 300,
        "workloads": {
            "grep": {"events_per_second": 5_000_000, "baseline_events_per_second": 4_800_000, "ratio_to_baseline": 1.04,
                     "verified": True, "peak_rss_mb": 2000, "command": "ember bench grep"},
            "grouping": {"events_per_second": 3_000_000, "verified": True, "latency_ms": lat, "command": "ember bench grouping"},
            "statemachine": {"events_per_second": 800_000, "baseline_events_per_second": 16_000, "ratio_to_baseline": 50.0,
                             "verified": True, "command": "ember bench statemachine"},
        },
        "sweep": {"rate": 500_000, "command": "ember bench sweep", "max_rate_throughput_range": 164.7, "verified": True,
                  "fixed_rate": [{**point, "events_per_second": 500_000}], "max_rate": [point, big]},
        "max_rate": {"command": "ember bench grouping --max-rate", "drain_events_per_second": 3_000_000,
                     "max_sustainable_events_per_second": 1_200_000, "backlog_bound_s": 2.0,
                     "trials": [{"rate": 1_800_000, "sustained": False}, {"rate": 1_200_000, "sustained": True}]},
        "scaling": {"local[1]": {"events_per_second": 1_600_000, "command": "ember bench grouping --master local[1]"},
                    "local[2]": {"error": ["boom"], "command": "ember bench grouping --master local[2]"}},
    }


def test_report_has_every_section_and_its_plots(tmp_path):
    path = write_report(_data(), str(tmp_path))
    text = open(path).read()
    for expected in ("| grep | 5,000,000 | 2,500,000 | 4,800,000 | 1.04 | 1,500,000 (Flink) | True | 2000 MB |",
                     "| grouping | 600 ms | 800 ms | 850 ms | 900 ms |",
                     "| max_rate | 0 ms | 2,000,000 | 2,800,000 |",
                     "sustains **1,200,000 events/s**", "1,800,000 no, 1,200,000 ok",
                     "| local[1] | 1,600,000 |", "| local[2] | failed: ['boom'] |",
                     "![throughput per core](throughput.png)", "![latency vs throughput (E3)](knob.png)"):
        assert expected in text, expected
    for png in ("throughput.png", "knob.png"):
        with open(os.path.join(tmp_path, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.exists(os.path.join(tmp_path, "report.json"))


def test_report_includes_the_peers_when_they_ran(tmp_path):
    data = _data()
    assert "Peers side by side" not in open(write_report(data, str(tmp_path / "without"))).read()
    data["peers"] = {
        "command": "ember bench peers --events 2000000", "keys": 100, "latency_rate": 2_000, "latency_seconds": 10.0,
        "packages": {"bytewax": "bytewax==0.21.1"},
        "throughput": [
            {"system": "ember", "job": "1 s tumbling window count", "events": 2_000_000, "events_per_second": 1_530_881,
             "seconds": {"small": 9.99, "full": 15.21}, "verified": True},
            {"system": "bytewax", "job": "running count, per record", "events": 2_000_000, "events_per_second": None,
             "seconds": {"small": 2.0, "full": 1.9}, "verified": False},
        ],
        "latency": [{"system": "bytewax", "job": "running count, per record",
                     "latency_ms": {"p50": 0.3, "p90": 0.4, "p99": 1.0}, "verified": True}],
    }
    text = open(write_report(data, str(tmp_path / "with"))).read()
    for expected in ("## Peers side by side", "`ember bench peers --events 2000000`", "bytewax==0.21.1",
                     "| ember | 1 s tumbling window count | 2,000,000 | 1,530,881 | 9.99 / 15.21 | yes |",
                     "| bytewax | running count, per record | 2,000,000 | n/a | 2.0 / 1.9 | no |",
                     "| bytewax | running count, per record | 0.3 | 0.4 | 1.0 | yes |",
                     "paced at 2,000 events/s for 10 s"):
        assert expected in text, expected
