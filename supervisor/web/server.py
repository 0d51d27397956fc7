"""Serve the dashboard: bind the socket ourselves (so a taken port or a bad host is one clear
line, before anything starts), then hand it to uvicorn, which runs the app in this process
until TERM or INT. This is its own process: ``supervisor start`` never runs it (the supervisor
forks, and must hold no thread).

uvicorn speaks HTTP through its h11 protocol with our guard on every connection
(``connections.py``: a request timeout, and bounds on the connections per client and in all);
it has no such bound of its own, and its ``limit_concurrency`` counts idle sockets too, so it is
left off: the guard keeps the open connections, and so the requests in flight, under its bound.

uvicorn's shutdown waits (up to ``timeout_graceful_shutdown``) for every response in progress,
and an event stream never ends of itself: ``DashboardServer`` ends the streams first, so a TERM
stops the dashboard at once with streams open."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys

import uvicorn

from workerproc.store import Operator, redact_url

from ..sockets import listen_tcp
from .app import create_app
from .config import WebConfig
from .connections import Connections, guarded_protocol
from .stream import Streams, opener_for

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
    streams = Streams(opener_for(config.db), config.max_streams)
    app = create_app(config, store, streams)
    server = DashboardServer(
        streams,
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            proxy_headers=False,
            http=guarded_protocol(Connections()),
            timeout_graceful_shutdown=5,
        ),
    )
    # uvicorn shuts down gracefully on TERM/INT, restores the handlers it found and raises the
    # signal again: ours only asks it to stop (a signal before it started counts too), so a
    # stop on request exits 0, as every other supervisor command does.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: setattr(server, "should_exit", True))
    mode = ", read-only" if config.read_only else ""
    auth = ", token required" if config.token else ""
    print(f"dashboard on {url_of(sock)} ({redact_url(config.db)}{mode}{auth})", flush=True)
    asyncio.run(server.serve_then_close(sock))
    return 0


class DashboardServer(uvicorn.Server):
    """uvicorn's server, whose shutdown ends the event streams before it waits for the open
    responses, and closes their store once it has stopped."""

    def __init__(self, streams: Streams, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.streams = streams

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.streams.stop()
        await super().shutdown(sockets)

    async def serve_then_close(self, sock: socket.socket) -> None:
        try:
            await self.serve(sockets=[sock])
        finally:
            await self.streams.close()
