"""``ember bench peers``' PyFlink program: run by the peer's own virtualenv, not by Ember.

    python pyflink_job.py CONFIG_JSON

CONFIG_JSON: ``{"workload": "running"|"window", "api": "datastream"|"sql", "events", "keys",
"per_second", "paced", "parallelism", "out", "start"}``.

- ``datastream``: Python functions on every record (thread mode): a number sequence ->
  ``(key, ts)`` -> ``key_by(key).reduce`` (running count, Flink's rolling reduce) or a 1 s
  tumbling event-time window counting per key (monotonous timestamps); each sink subtask
  writes ``<out>.<subtask>.json`` with what it saw (as the Bytewax program does).
- ``sql``: the same jobs in Flink SQL (no Python on the data path): ``datagen`` sequence ->
  ``GROUP BY k`` (running count, updates collected as a changelog) or ``TUMBLE`` window;
  the client collects the results and writes ``<out>.0.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_events import WINDOW_MS, event_index, key_of, time_of  # noqa: E402

SAMPLE = 97


def _tally_file(cfg: dict, index: object, tally: dict) -> None:
    Path(f"{cfg['out']}.{index}.json").write_text(json.dumps(tally))


_STARTS: dict[str, float] = {}


def _paced_start(path: str) -> float:
    """The wall time event 0 is due in a paced run: fixed by whichever function asks first
    (the job's first event, once Flink has started), shared through a file by every
    subtask's functions."""
    found = _STARTS.get(path)
    if found is not None:
        return found
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        with os.fdopen(fd, "w") as f:
            f.write(repr(time.time() + 0.5))
    except FileExistsError:
        pass
    for _ in range(1000):
        text = Path(path).read_text()
        if text:
            _STARTS[path] = float(text)
            return _STARTS[path]
        time.sleep(0.001)
    raise RuntimeError(f"{path} stays empty")


def datastream(cfg: dict) -> None:
    from pyflink.common import Configuration, Types, WatermarkStrategy
    from pyflink.common.watermark_strategy import TimestampAssigner
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.datastream.functions import MapFunction, ProcessWindowFunction
    from pyflink.datastream.window import TumblingEventTimeWindows

    conf = Configuration()
    conf.set_string("python.execution-mode", "thread")
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(cfg["parallelism"])
    env.set_python_executable(sys.executable)
    keys, ps, paced = cfg["keys"], cfg["per_second"], cfg["paced"]
    start_file = cfg["out"] + ".start"

    def event(i: int) -> tuple[int, int]:
        if paced:
            wait = _paced_start(start_file) + i / ps - time.time()
            if wait > 0:
                time.sleep(wait)
        return key_of(i, keys), time_of(i, ps)

    class Tally(MapFunction):
        def open(self, ctx) -> None:  # noqa: ANN001
            self.index = uuid.uuid4().hex  # one file per subtask (thread mode has no subtask index to read)
            self.t = {"outputs": 0, "total": 0, "late": 0, "latest": {}, "windows": [], "latency_ms": [], "last": 0.0}

        def map(self, row):  # noqa: ANN001, ANN201
            now = time.time()
            t = self.t
            t["outputs"] += 1
            t["last"] = now
            if cfg["workload"] == "window":
                key, start_ms, count = row
                t["windows"].append((key, start_ms, count))
                if paced:
                    t["latency_ms"].append((now - _paced_start(start_file)) * 1000 - (start_ms + WINDOW_MS))
            else:
                key, count = row
                t["total"] += count
                if count > t["latest"].get(str(key), 0):
                    t["latest"][str(key)] = count
                if paced and count % SAMPLE == 0:
                    t["latency_ms"].append((now - _paced_start(start_file) - event_index(key, count, keys) / ps) * 1000)
            return 0

        def close(self) -> None:
            _tally_file(cfg, self.index, self.t)

    seq = env.from_source(NumberSequenceSource(0, cfg["events"] - 1), WatermarkStrategy.no_watermarks(), "events")
    events = seq.map(event, output_type=Types.TUPLE([Types.INT(), Types.LONG()]))
    if cfg["workload"] == "window":
        class Stamp(TimestampAssigner):
            def extract_timestamp(self, value, record_timestamp):  # noqa: ANN001, ANN201
                return value[1]

        class Count(ProcessWindowFunction):
            def process(self, key, context, elements):  # noqa: ANN001, ANN201
                yield key, context.window().start, sum(1 for _ in elements)

        stamped = events.assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(Stamp()))
        results = (stamped.key_by(lambda e: e[0], key_type=Types.INT())
                   .window(TumblingEventTimeWindows(WINDOW_MS, 0))
                   .process(Count(), output_type=Types.TUPLE([Types.INT(), Types.LONG(), Types.LONG()])))
    else:
        ones = events.map(lambda e: (e[0], 1), output_type=Types.TUPLE([Types.INT(), Types.LONG()]))
        results = ones.key_by(lambda e: e[0], key_type=Types.INT()).reduce(lambda a, b: (a[0], a[1] + b[1]))
    results.map(Tally(), output_type=Types.INT()).filter(lambda _: False).print()
    env.execute("peers")


def sql(cfg: dict) -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    conf.set("parallelism.default", str(cfg["parallelism"]))
    if cfg["workload"] != "window":  # the changelog of GROUP BY, compacted per mini-batch
        conf.set("table.exec.mini-batch.enabled", "true")
        conf.set("table.exec.mini-batch.allow-latency", "200 ms")
        conf.set("table.exec.mini-batch.size", "5000")
    n, keys, ps = cfg["events"], cfg["keys"], cfg["per_second"]
    t_env.execute_sql(f"""
        CREATE TABLE events (
            i BIGINT,
            k AS CAST(i % {keys} AS INT),
            ts AS TO_TIMESTAMP_LTZ(CAST(FLOOR(i * 1000 / {ps}) AS BIGINT), 3),
            WATERMARK FOR ts AS ts
        ) WITH ('connector' = 'datagen', 'fields.i.kind' = 'sequence', 'fields.i.start' = '0',
                'fields.i.end' = '{n - 1}', 'rows-per-second' = '1000000000')""")
    t: dict[str, Any] = {"outputs": 0, "total": 0, "late": 0, "latest": {}, "windows": [], "latency_ms": [], "last": 0.0}
    if cfg["workload"] == "window":
        query = f"""SELECT k, window_start, COUNT(*) FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '{WINDOW_MS // 1000}' SECOND))
                    GROUP BY k, window_start, window_end"""
    else:
        query = "SELECT k, COUNT(*) FROM events GROUP BY k"
    with t_env.execute_sql(query).collect() as rows:
        for row in rows:
            t["outputs"] += 1
            if cfg["workload"] == "window":
                k, window_start, count = row[0], row[1], row[2]
                t["windows"].append((k, int(window_start.timestamp() * 1000), count))
            else:
                kind = str(row.get_row_kind())
                k, count = row[0], row[1]
                if "DELETE" in kind or "UPDATE_BEFORE" in kind:
                    continue
                if count > t["latest"].get(str(k), 0):
                    t["latest"][str(k)] = count
    t["last"] = time.time()
    _tally_file(cfg, 0, t)


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    while time.time() < cfg["start"]:
        time.sleep(0.001)
    (sql if cfg["api"] == "sql" else datastream)(cfg)


if __name__ == "__main__":
    main()
