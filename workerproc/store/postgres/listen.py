"""The LISTEN side of the PostgreSQL store: one raw libpq connection per store (per process),
opened on first use, that makes ``change_token`` free and lets ``wait_change`` and ``wait``
sleep on notifications instead of polling.

Channels: ``work`` (a run's ``ready_at`` appeared or moved earlier: enqueue, advance, release,
retry, a dead owner's leases released) and ``end`` (a watched run ended: ``Store.wait``).
Each notification bumps its channel's counter; a token is a counter read after a zero-timeout
``poll``: no round trip. LISTEN is sent on the first call of an idle spell; a successful claim
UNLISTENs (without waiting), so busy workers are not signalled on every commit. A lost
connection bumps every counter (notifications may have been missed) and is reopened with
backoff. One lock serialises the connection's use across threads; sleeps happen outside it.
"""

from __future__ import annotations

import os
import threading
import time

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import make_conninfo

from ..readiness import readable, writable

_BACKOFF_MIN, _BACKOFF_MAX = 0.05, 1.0
WORK, END = "work", "end"

# Connections inherited across fork() are kept referenced forever in the child: closing (or
# garbage-collecting) one there would send a Terminate on the parent's socket.
ABANDONED: list[object] = []


class Listener:
    def __init__(
        self, conninfo: str, channels: dict[str, str], network: dict[str, int] | None = None
    ) -> None:
        self.conninfo = conninfo
        self.network = network or {}  # keepalives and TCP_USER_TIMEOUT (dialect.network_params)
        self.channels = channels  # our name -> the server's channel name
        self.counts = dict.fromkeys(channels, 0)
        self._by_server_name = {server: ours for ours, server in channels.items()}
        self._conn: pq.abc.PGconn | None = None
        self._listening = False
        self._retry_at = 0.0
        self._backoff = _BACKOFF_MIN
        self._lock = threading.Lock()
        self._pid = os.getpid()

    # -- tokens --------------------------------------------------------------------------------
    def token(self, channel: str | None = None) -> int:
        """The notifications seen so far on ``channel`` (None: on every channel)."""
        self._after_fork()
        with self._lock:
            self._refresh()
            return self._count(channel)

    def wait(self, token: int, timeout: float, channel: str | None = None) -> int:
        """Sleep until the token of ``channel`` differs from ``token`` or ``timeout`` passes;
        return the current token. Sleeps on the connection's socket (or, while it cannot be
        opened, in short steps until the next reconnect attempt)."""
        deadline = time.monotonic() + timeout
        self._after_fork()
        while True:
            with self._lock:
                self._refresh()
                current = self._count(channel)
                sock = self._conn.socket if self._conn is not None else None
                retry_at = self._retry_at
            left = deadline - time.monotonic()
            if current != token or left <= 0:
                return current
            if sock is None:
                time.sleep(max(0.0, min(left, retry_at - time.monotonic(), 0.25)) or 0.01)
                continue
            try:
                readable((sock,), min(left, 1.0))
            except (OSError, ValueError):  # closed meanwhile by another thread: look again
                time.sleep(0.01)

    def socket(self) -> int | None:
        """The LISTEN connection's socket, listening (None while it cannot be opened): it
        becomes readable when a notification comes (``ListenWatch``)."""
        self._after_fork()
        with self._lock:
            if self._conn is None or not self._listening:  # (never drains a listening one:
                self._refresh()  # what is waiting on it is what the caller sleeps for)
            return self._conn.socket if self._conn is not None else None

    def idle_over(self) -> None:
        """A claim found work: stop listening until the next idle spell (fire and forget)."""
        self._after_fork()
        with self._lock:
            conn = self._conn
            if conn is None or not self._listening:
                return
            try:
                self._drain()  # the previous UNLISTEN's result, if any
                conn.send_query(b"UNLISTEN *")
                for _ in range(10):  # nonblocking: push the query out (a few bytes: at once)
                    if conn.flush() == 0:
                        break
                    writable(conn.socket, 0.1)
                self._listening = False
            except (psycopg.Error, OSError):
                self._drop()

    # -- the connection ------------------------------------------------------------------------
    def _count(self, channel: str | None) -> int:
        return sum(self.counts.values()) if channel is None else self.counts[channel]

    def _after_fork(self) -> None:
        if self._pid != os.getpid():  # a forked child: never touch the parent's connection
            self.abandon()

    def _refresh(self) -> None:
        if self._conn is None:
            if time.monotonic() < self._retry_at:
                return
            self._connect()
        if self._conn is None:
            return
        try:
            if not self._listening:
                self._listen()
            self._drain()
        except (psycopg.Error, OSError):
            self._drop()

    def _bump(self) -> None:
        for name in self.counts:
            self.counts[name] += 1

    def _connect(self) -> None:
        try:
            info = make_conninfo(self.conninfo, application_name="leasekeeper", connect_timeout=2,
                                **self.network)  # fmt: skip
            conn = pq.PGconn.connect(info.encode())
            if conn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError(conn.get_error_message())
            conn.nonblocking = 1
            self._conn = conn
            self._backoff = _BACKOFF_MIN
            self._bump()  # notifications may have been missed while disconnected
        except psycopg.Error:
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _BACKOFF_MAX)

    def _listen(self) -> None:
        conn = self._conn
        assert conn is not None
        self._drain()
        for _ in range(20):  # an UNLISTEN still in flight: let it finish first
            if not conn.is_busy():
                break
            readable((conn.socket,), 0.1)
            self._drain()
        else:
            raise psycopg.OperationalError("the listening connection does not answer")
        query = b"; ".join(
            b"LISTEN " + sql.Identifier(name).as_string(None).encode()
            for name in self.channels.values()
        )
        conn.nonblocking = 0
        try:
            conn.send_query(query)
            while (result := conn.get_result()) is not None:
                if result.status != pq.ExecStatus.COMMAND_OK:
                    raise psycopg.OperationalError(conn.get_error_message())
        finally:
            conn.nonblocking = 1
        self._listening = True

    def _drain(self) -> None:
        conn = self._conn
        assert conn is not None
        if readable((conn.socket,), 0):
            conn.consume_input()
            if conn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listening connection was lost")
            while not conn.is_busy() and conn.get_result() is not None:
                pass  # results of a fire-and-forget UNLISTEN
        while (note := conn.notifies()) is not None:
            ours = self._by_server_name.get(note.relname.decode())
            if ours is not None:
                self.counts[ours] += 1

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.finish()
        self._conn = None
        self._listening = False
        self._bump()  # look again: something may have changed while we could not hear

    def abandon(self) -> None:
        """In a forked child: forget the parent's connection without touching it."""
        if self._conn is not None:
            ABANDONED.append(self._conn)
        self._conn = None
        self._listening = False
        self._lock = threading.Lock()  # a lock held by a parent's thread would never be freed
        self._pid = os.getpid()

    def close(self) -> None:
        self._after_fork()
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.finish()
            self._conn = None
            self._listening = False


class ListenWatch:
    """The LISTEN connection as a ``ChangeWatch``: its socket to sleep on, and whether a
    notification moved a counter since the last look."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.pid = os.getpid()
        self.seen = listener.token()

    def fileno(self) -> int | None:
        return self.listener.socket()

    def drain(self) -> bool:
        now = self.listener.token()
        moved, self.seen = now != self.seen, now
        return moved
