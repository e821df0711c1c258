"""The dashboard's server: loopback by default, read-only, its endpoints (a real uvicorn
server on a real socket; no Spark)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import dashboard_job
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ember import StreamEnvironment
from ember.errors import ConfigError
from ember.ui import Dashboard, JobMonitor


@pytest.fixture
def monitor():
    env = StreamEnvironment()
    dashboard_job.build(env)
    return JobMonitor(env.graph(), "served")


def _get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.headers.get("content-type", ""), response.read()


def test_serves_the_page_the_json_and_prometheus_on_loopback(monitor):
    with Dashboard(monitor, port=0) as board:
        assert board.host == "127.0.0.1" and board.url == f"http://127.0.0.1:{board.port}/"
        status, kind, body = _get(board.url)
        assert status == 200 and kind.startswith("text/html") and b'<svg id="graph"' in body
        for asset in ("app.js", "style.css"):
            assert _get(board.url + asset)[0] == 200
        status, kind, body = _get(board.url + "api/job")
        snap = json.loads(body)
        assert kind.startswith("application/json") and snap["job"] == "served"
        assert [s["name"] for s in snap["graph"]] == [s["name"] for s in monitor.steps]
        graph = json.loads(_get(board.url + "api/graph")[2])
        assert {s["name"] for s in graph["steps"]} >= {"ad-events", "count-per-type", "label", "counts", "even", "dead-letters"}
        status, kind, body = _get(board.url + "metrics")
        assert kind.startswith("text/plain") and "version=0.0.4" in kind
        assert {f.name for f in text_string_to_metric_families(body.decode())} >= {"ember_events", "ember_batch_duration_seconds"}


def test_no_endpoint_accepts_a_change(monitor):
    with Dashboard(monitor, port=0) as board:
        for path in ("", "api/job", "api/graph", "metrics", "healthz", "app.js"):
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                request = urllib.request.Request(board.url + path, data=b"{}", method=method)
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=10)
                assert refused.value.code == 405, (method, path)


def test_it_is_not_reachable_on_the_machines_other_addresses(monitor):
    others = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
    others |= {_outbound_address()} - {None, "127.0.0.1"}
    with Dashboard(monitor, port=0) as board:
        assert _get(board.url + "healthz")[2] == b"ok"
        for address in others:
            with pytest.raises(OSError):
                socket.create_connection((address, board.port), timeout=2).close()


def _outbound_address() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: picks the interface a route would use
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


def test_a_non_loopback_address_is_refused_unless_asked(monitor, capsys):
    with pytest.raises(ConfigError, match="binds 127.0.0.1 unless asked"):
        Dashboard(monitor, host="0.0.0.0", port=0)
    address = _outbound_address()
    if address is None or address.startswith("127."):
        pytest.fail("this machine has no non-loopback address to check the opt-in with")
    board = Dashboard(monitor, host=address, port=0, allow_remote=True)
    try:
        assert "without authentication" in capsys.readouterr().err
        assert board.host == address
    finally:
        board.stop()


def test_a_taken_port_or_a_bad_one_fails_before_anything_runs(monitor):
    with Dashboard(monitor, port=0) as first:
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            Dashboard(monitor, port=first.port)
    with pytest.raises(ConfigError, match="port"):
        Dashboard(monitor, port=70000)


def test_execute_checks_its_ui_arguments_before_the_job_starts():
    env = StreamEnvironment()
    dashboard_job.build(env)
    with pytest.raises(ConfigError, match="ui must be"):
        env.execute("x", ui="yes")
    env = StreamEnvironment()
    dashboard_job.build(env)
    with pytest.raises(ConfigError, match="ui_linger_s"):
        env.execute("x", ui=0, ui_linger_s=-1)
