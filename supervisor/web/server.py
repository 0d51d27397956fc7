"""Serve the dashboard: bind the socket ourselves (so a taken port or a bad host is one clear
line, before anything starts), then hand it to uvicorn, which runs the app in this process
until TERM or INT. This is its own process: ``supervisor start`` never runs it (the supervisor
forks, and must hold no thread).

uvicorn speaks HTTP through its h11 protocol with our guard on every connection
(``connections.py``: a request timeout, and bounds on the connections per client and in all);
it has no such bound of its own, and its ``limit_concurrency`` counts idle sockets too, so it is
left off: the guard keeps the open connections, and so the requests in flight, under its bound."""

from __future__ import annotations

import signal
import socket
import sys

import uvicorn

from workerproc.store import Operator, redact

from ..sockets import listen_tcp
from .app import create_app
from .config import WebConfig
from .connections import Connections, guarded_protocol

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def bind(host: str, port: int) -> socket.socket:
    # a burst of connects (the guard closes the idle ones) must not overflow the accept queue
    return listen_tcp(host, port, option="--host", backlog=1024)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def serve(config: WebConfig, store: Operator) -> int:
    sock = bind(config.host, config.port)
    if config.token is None and config.host not in LOOPBACK:
        print(f"supervisor: warning: serving on {config.host} without --token: anyone who can "
              "reach it can read every run and retry or cancel runs", file=sys.stderr)  # fmt: skip
    app = create_app(config, store)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            proxy_headers=False,
            http=guarded_protocol(Connections()),
            timeout_graceful_shutdown=5,
        )
    )
    # uvicorn shuts down gracefully on TERM/INT, restores the handlers it found and raises the
    # signal again: ours only asks it to stop (a signal before it started counts too), so a
    # stop on request exits 0, as every other supervisor command does.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: setattr(server, "should_exit", True))
    mode = ", read-only" if config.read_only else ""
    auth = ", token required" if config.token else ""
    print(f"dashboard on {url_of(sock)} ({redact(config.db)}{mode}{auth})", flush=True)
    server.run(sockets=[sock])
    return 0
