"""Slow and greedy clients: a bound on the time to send a request, and on the connections each
client (and all of them) may hold.

uvicorn has no timeout for a request's head: a socket that sends ``GET / HTTP/1.1\\r\\n`` and
nothing more stays open for as long as its client likes, and every open socket counts against
``limit_concurrency`` — 64 of them made every other client get 503. So the dashboard
serves uvicorn's h11 protocol with this guard on each connection:

- **Request timeout.** From the moment the server waits for a request (the connection opened,
  or the previous response was sent) the client has ``request_timeout`` seconds to send all of
  it, head and body; then the connection is closed. The handler's own time is never counted.
  This holds before any authentication: the token is checked once the head is in.
- **Body size.** A ``Content-Length`` over the largest form is answered 413 at once (the app's
  ``max_body_size``), and a response sent before the body was all received (that 413, a 401
  without the token, a 403) closes the connection: the rest of the body is never waited for.
- **Connections.** Each client address may hold ``per_client`` connections and all clients
  ``limit``. A connection over either bound makes room by closing one that is not being
  served: the *oldest still sending its body*, else the *oldest idle* one (no request in
  progress: waiting for a head, or between requests). So neither idle sockets nor trickled
  bodies can crowd out a real request (288 connections trickling a 16,000-byte body
  from 9 addresses let 1 GET in 89 through); a request whose whole head is in and that sends no
  body (a page's GET) is served, never closed for room. When every connection is being
  served, the newcomer is closed instead.

Everything runs on the server's one event loop: no lock is needed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_TIMEOUT = 10.0  # seconds to send a whole request (the largest is a 16 KiB form)
MAX_CONNECTIONS = 256  # open connections, all clients together
PER_CLIENT = 32  # open connections per client address (a proxy is one client: see README)


class Connections:
    """The open connections, oldest first: all of them, and per client address."""

    def __init__(self, limit: int = MAX_CONNECTIONS, per_client: int = PER_CLIENT) -> None:
        self.limit = limit
        self.per_client = per_client
        self.open: dict[GuardedH11Protocol, None] = {}
        self.by_client: dict[str, dict[GuardedH11Protocol, None]] = {}

    def admit(self, conn: GuardedH11Protocol) -> bool:
        """Count a new connection in, closing an older idle one when a bound is passed; False
        when none could make room (the caller closes the newcomer)."""
        mine = self.by_client.setdefault(conn.client_key, {})
        mine[conn] = None
        self.open[conn] = None
        for pool, bound in ((mine, self.per_client), (self.open, self.limit)):
            if len(pool) > bound and not self._close_oldest_idle(pool, conn):
                self.forget(conn)
                return False
        return True

    def _close_oldest_idle(self, pool: dict[GuardedH11Protocol, None], newcomer: object) -> bool:
        """Close the oldest connection still sending its body, else the oldest idle one."""
        for body in (True, False):
            for conn in pool:
                if conn is not newcomer and (conn.sending_body if body else conn.idle):
                    conn.drop()
                    return True
        return False

    def forget(self, conn: GuardedH11Protocol) -> None:
        self.open.pop(conn, None)
        mine = self.by_client.get(conn.client_key)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.by_client[conn.client_key]


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request timeout, counted in ``Connections``."""

    registry: Connections  # set per server by guarded_protocol()
    request_timeout: float

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.deadline: asyncio.TimerHandle | None = None
        peer = transport.get_extra_info("peername")
        self.client_key = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if not self.registry.admit(self):
            transport.close()  # every connection of this client (or of all) is busy
            return
        self._wait_for_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.forget(self)
        self._stop_waiting()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._wait_for_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.sending_body:  # answered before its body was in (413, 401): never read it
            self.drop()
            return
        self._wait_for_request()

    @property
    def idle(self) -> bool:
        """No request in progress: nothing of one received, or only part of its head."""
        return self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE

    @property
    def sending_body(self) -> bool:
        """Its request's head is in, its body is still arriving (no handler waits on it but
        to read it)."""
        return self.conn.their_state is h11.SEND_BODY

    def drop(self) -> None:
        """Close this connection now (it no longer counts)."""
        self.registry.forget(self)
        self._stop_waiting()
        if not self.transport.is_closing():
            self.transport.close()

    def _wait_for_request(self) -> None:
        """Arm the deadline while the client owes us (part of) a request; disarm it once the
        whole request is in. The deadline counts from the start of the wait, whatever arrives
        in between: a byte a second never renews it."""
        owed = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
        if not owed or self.transport.is_closing():
            self._stop_waiting()
        elif self.deadline is None:
            self.deadline = self.loop.call_later(self.request_timeout, self._too_slow)

    def _stop_waiting(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _too_slow(self) -> None:
        self.deadline = None
        self.drop()


def guarded_protocol(
    connections: Connections, request_timeout: float = REQUEST_TIMEOUT
) -> type[GuardedH11Protocol]:
    """A protocol class for one server (uvicorn's ``http=``), sharing ``connections``."""
    attrs: dict[str, Any] = {"registry": connections, "request_timeout": request_timeout}
    return type("DashboardH11Protocol", (GuardedH11Protocol,), attrs)
