"""How benchmarks turn progress reports into throughput and a sustained/not verdict."""

from ember.bench.harness import RunOutcome, throughput
from ember.bench.sustainable import sustained


def _reports(rows, every_s=1.0, lags=None, busy_ms=300):
    out = []
    for i, n in enumerate(rows):
        seconds = i * every_s
        r = {"batchId": i, "numInputRows": n, "timestamp": f"2026-11-21T10:00:{int(seconds):02d}.{int(seconds % 1 * 1000):03d}Z",
             "durationMs": {"triggerExecution": busy_ms}}
        if lags is not None:
            r["lag"] = lags[i]
        out.append(r)
    return out


def test_open_loop_throughput_is_input_taken_in_over_wall_time_not_busy_time():
    # One batch a second, 100 events each, 300 ms busy: the job takes in 100 events/s.
    reports = _reports([5_000, 400] + [100] * 10)
    events, busy, eps = throughput(reports, rate=100, wall_s=12)
    assert eps == 100.0
    assert busy == 3.0  # 10 steady batches x 300 ms
    # Draining (no rate): events over busy time.
    assert throughput(reports)[2] == 1000 / 3.0


def test_a_rate_is_sustained_while_the_backlog_stays_within_the_bound():
    steady = RunOutcome(0, 0, 0, progress=_reports([100] * 9, lags=[900, 50, 40, 60, 50, 40, 50, 60, 50]))
    assert sustained(steady, 100, 2.0) == (True, 60)
    growing = RunOutcome(0, 0, 0, progress=_reports([100] * 9, lags=[0, 50, 100, 150, 200, 250, 300, 350, 400]))
    assert sustained(growing, 100, 2.0) == (False, 400)
    unknown = RunOutcome(0, 0, 0, progress=_reports([100] * 9))
    assert sustained(unknown, 100, 2.0) == (False, -1)
