"""The dashboard's web server: a Starlette app served by uvicorn on a thread of the job's
driver, read-only (GET only; nothing it serves changes the job).

    GET /             the page (static/index.html; it polls /api/job once a second)
    GET /api/job      the job's snapshot (model.JobMonitor.snapshot), JSON
    GET /api/graph    the steps users wrote, JSON
    GET /metrics      Prometheus text format
    GET /healthz      "ok"
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import threading
from typing import Any

from ember.errors import ConfigError
from ember.job import DASHBOARD_PORT
from ember.ui.model import JobMonitor
from ember.ui.prometheus import CONTENT_TYPE, metrics_text, registry_for

__all__ = ["Dashboard", "DEFAULT_PORT", "DEFAULT_HOST", "is_loopback"]

DEFAULT_PORT = DASHBOARD_PORT
DEFAULT_HOST = "127.0.0.1"
STATIC = os.path.join(os.path.dirname(__file__), "static")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _app(monitor: JobMonitor) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    registry = registry_for(monitor)
    no_cache = {"Cache-Control": "no-store"}

    async def job(request: Any) -> Any:
        return JSONResponse(monitor.snapshot(), headers=no_cache)

    async def graph(request: Any) -> Any:
        return JSONResponse({"job": monitor.job, "steps": monitor.steps}, headers=no_cache)

    async def metrics(request: Any) -> Any:
        return Response(metrics_text(registry), media_type=CONTENT_TYPE, headers=no_cache)

    async def healthz(request: Any) -> Any:
        return PlainTextResponse("ok")

    return Starlette(routes=[
        Route("/api/job", job, methods=["GET"]),
        Route("/api/graph", graph, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Mount("/", app=StaticFiles(directory=STATIC, html=True)),
    ])


class Dashboard:
    """Serves ``monitor`` on ``host:port`` (port 0: any free port) until :meth:`stop`.

    The socket is bound here, before the job starts: a taken port or an address that
    is not this machine's fails at once, with the address. An address other than
    loopback is refused unless ``allow_remote`` (the page has no authentication: anyone
    who reaches it sees the job's steps and numbers); allowed, it warns."""

    def __init__(self, monitor: JobMonitor, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 allow_remote: bool = False) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ConfigError(f"the dashboard's port must be an int from 0 to 65535, got {port!r}")
        if not is_loopback(host):
            if not allow_remote:
                raise ConfigError(
                    f"the dashboard binds 127.0.0.1 unless asked: {host!r} is not a loopback address "
                    "(pass ui_host explicitly / --ui-host to serve it there)"
                )
            print(f"[ember] warning: the dashboard serves {host}:{port} without authentication; "
                  "anyone who reaches that address sees the job", file=sys.stderr, flush=True)
        self.monitor = monitor
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError as exc:
            self._socket.close()
            raise ConfigError(f"the dashboard cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self._socket.listen(64)
        self.host, self.port = host, self._socket.getsockname()[1]
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> "Dashboard":
        import uvicorn

        config = uvicorn.Config(_app(self.monitor), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        # Not the main thread: uvicorn leaves the process's signal handlers (Ctrl-C stops the job) alone.
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="ember-dashboard", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> "Dashboard":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
