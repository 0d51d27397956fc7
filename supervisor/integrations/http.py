"""A tiny HTTP endpoint served from the supervisor's main loop: no thread, no blocking call.

The supervisor forks, so it must not run a server thread (``forking.py`` refuses to fork with
one). Instead the listening socket and every connection are non-blocking; their descriptors go
into ``wake_fds``, a set the loop's sleep (``SignalInbox.wait``) also selects on, so a scrape
wakes the loop at once and a loop step (``serve``) accepts, reads and answers what is ready.
A slow or silent client costs nothing: it is dropped after ``TIMEOUT`` seconds, and at most
``MAX_CONNECTIONS`` are kept. Forked workers close their inherited copies (``close_in_child``).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..sockets import listen_tcp

MAX_REQUEST = 8192
MAX_CONNECTIONS = 16
TIMEOUT = 5.0
Render = Callable[[], tuple[str, str]]  # -> (content type, body)


@dataclass
class _Conn:
    sock: socket.socket
    since: float
    inbuf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening socket for ``--metrics-port`` (the loop's select waits on it)."""
    return listen_tcp(
        host, port, option="--metrics-host", backlog=MAX_CONNECTIONS, nonblocking=True
    )


class HttpEndpoint:
    def __init__(
        self,
        sock: socket.socket,
        routes: dict[str, Render],
        wake_fds: set[int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sock = sock
        self.routes = routes
        self.wake_fds = wake_fds
        self.clock = clock
        self.conns: dict[int, _Conn] = {}
        self.served = 0
        self._watched: set[int] = set()
        self._sync_fds()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def serve(self) -> bool:
        """Do what can be done without blocking; True when output is still pending."""
        now = self.clock()
        self._accept(now)
        for fd, conn in list(self.conns.items()):
            if now - conn.since > TIMEOUT:
                self._drop(fd)
                continue
            if conn.out is None:
                self._read(fd, conn)
            if conn.out is not None:
                self._write(fd, conn)
        self._sync_fds()
        return any(c.out is not None for c in self.conns.values())

    def _accept(self, now: float) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and friends: try again on the next turn
                return
            if len(self.conns) >= MAX_CONNECTIONS:
                sock.close()  # drain the backlog rather than spin on a readable listener
                continue
            sock.setblocking(False)
            self.conns[sock.fileno()] = _Conn(sock, now)

    def _read(self, fd: int, conn: _Conn) -> None:
        while conn.out is None:
            try:
                data = conn.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._drop(fd)
                return
            if not data:
                self._drop(fd)
                return
            conn.inbuf += data
            if b"\r\n\r\n" in conn.inbuf or b"\n\n" in conn.inbuf:
                conn.out = memoryview(self.respond(bytes(conn.inbuf)))
            elif len(conn.inbuf) > MAX_REQUEST:
                conn.out = memoryview(_response(431, "text/plain", "request too large\n"))

    def _write(self, fd: int, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(fd)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self.served += 1
            self._drop(fd)

    def respond(self, request: bytes) -> bytes:
        line = request.split(b"\n", 1)[0].decode("latin-1").strip()
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response(400, "text/plain", "bad request\n")
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response(405, "text/plain", "only GET and HEAD\n", allow="GET, HEAD")
        route = self.routes.get(target)
        if route is None:
            paths = ", ".join(sorted(self.routes))
            return _response(404, "text/plain", f"not found; try {paths}\n")
        content_type, body = route()
        return _response(200, content_type, body, head=method == "HEAD")

    def _drop(self, fd: int) -> None:
        conn = self.conns.pop(fd, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sock.close()

    def _sync_fds(self) -> None:
        """Wake the loop for new connections and for requests still being read."""
        self.wake_fds -= self._watched
        self._watched = {self.sock.fileno()} | {fd for fd, c in self.conns.items() if c.out is None}
        self.wake_fds |= self._watched

    def close(self) -> None:
        for fd in list(self.conns):
            self._drop(fd)
        self.wake_fds -= self._watched
        self._watched = set()
        with contextlib.suppress(OSError):
            self.sock.close()

    close_in_child = close  # a forked worker drops its copies; the parent's stay open


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large"}  # fmt: skip


def _response(
    status: int, content_type: str, body: str, *, head: bool = False, allow: str | None = None
) -> bytes:
    payload = body.encode()
    headers = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(payload)}",
        "Connection: close",
    ]
    if allow:
        headers.append(f"Allow: {allow}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + (b"" if head else payload)
