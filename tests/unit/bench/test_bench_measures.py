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


def test_anonymous_rss_leaves_out_the_pages_of_mapped_files(tmp_path):
    """A child that maps and reads a 64 MiB file grows the tree's RSS by about that, not its
    anonymous RSS; one that allocates 64 MiB grows both (the delta layout's working copies
    are mapped files: benchmarks report both figures)."""
    import os
    import subprocess
    import sys
    import time

    from ember.bench.memory import tree_rss_bytes

    size = 64 << 20
    (tmp_path / "data").write_bytes(b"\1" * size)
    script = {
        "mapped": f"import mmap,sys; f=open({str(tmp_path / 'data')!r},'rb'); m=mmap.mmap(f.fileno(),0,access=mmap.ACCESS_READ); "
                  "s=sum(m[i] for i in range(0,len(m),4096)); print('ready',flush=True); sys.stdin.read()",
        "allocated": f"import sys; b=bytearray({size}); b[::4096]=b'\\2'*len(b[::4096]); print('ready',flush=True); sys.stdin.read()",
    }
    grown = {}
    for what, code in script.items():
        before = (tree_rss_bytes(os.getpid()), tree_rss_bytes(os.getpid(), anonymous=True))
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(0.1)
            after = (tree_rss_bytes(os.getpid()), tree_rss_bytes(os.getpid(), anonymous=True))
        finally:
            child.communicate("")
        grown[what] = (after[0] - before[0], after[1] - before[1])
    mib = 1 << 20
    assert grown["mapped"][0] > 50 * mib and grown["mapped"][1] < 40 * mib, grown
    assert grown["allocated"][0] > 50 * mib and grown["allocated"][1] > 50 * mib, grown
