"""One webhook POST, bounded (docs/protocol.md B20): a total deadline over connecting,
sending and the whole answer, and at most ``MAX_ANSWER`` bytes of the answer read.

A socket timeout bounds one wait for one read; a receiver that answers one byte a second never
trips it. So each POST arms a ``Watchdog``: at the POST's deadline it shuts down the sockets of
the client that sends it (``shutdown``, unlike ``close``, wakes a read, a write or a TLS
handshake blocked in another thread at once), and the POST fails with that reason. The client
learns its sockets from httpcore's ``trace`` extension (each new connection's, plain and TLS);
it is one thread's, and that thread sends one POST at a time, so at a deadline every socket it
holds is that POST's or an idle one (which the pool replaces). An answer's body is read in
pieces and given up on past ``MAX_ANSWER`` bytes (the connection is closed, the rest never
read), so an endless answer costs a worker no memory.

Resolving the host's name is under the deadline too: ``getaddrinfo`` takes no timeout, so the
POST asks for it in a thread of its own first and waits for it until the deadline at most (a
name that does not resolve in time fails the POST; the thread ends with the resolver's own
timeout). A new connection then resolves the name again, as the HTTP library does: fast after
a fresh answer, though that second lookup is the resolver's to bound, not ours. A name that
resolved is not looked up again for ``RESOLVED_FOR`` seconds: its connection is most likely
reused, and a lookup per POST would cost every delivery.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

MAX_ANSWER = 64 * 1024  # bytes of an answer's body read at most: more is a failure
PIECE = 16 * 1024  # bytes asked for per read of an answer's body
IDLE = 1.0  # the watchdog looks at its list at least this often (every wait is bounded)
MAX_ERROR = 300  # characters of a failure's reason kept
RESOLVED_FOR = 60.0  # seconds a name that resolved is not looked up again before a POST
Resolver = Callable[[str, int], object]  # (host, port): raises OSError when the name is unknown


def getaddrinfo(host: str, port: int) -> object:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


class Watchdog:
    """One thread per process: runs each armed callback at its deadline, unless it was disarmed
    first. A callback must be quick (it shuts sockets down)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int]] = []  # (deadline, token), a heap
        self._armed: dict[int, Callable[[], None]] = {}
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._pid = 0

    def arm(self, deadline: float, fire: Callable[[], None]) -> int:
        """Run ``fire`` at ``deadline`` (monotonic) unless ``disarm``ed; a token for that."""
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()  # (a forked child has no thread of its parent's)
                self._thread = threading.Thread(target=self._main, name="post-watchdog",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            token = next(self._tokens)
            self._armed[token] = fire
            # the thread sleeps until the earliest deadline it knows or ``IDLE``: woken only for
            # one sooner than both (a POST's deadline, seconds away, rarely is: two context
            # switches per POST saved)
            first = self._due[0][0] if self._due else math.inf
            heapq.heappush(self._due, (deadline, token))
            if deadline < min(first, time.monotonic() + IDLE):
                self._lock.notify()
        return token

    def disarm(self, token: int) -> None:
        with self._lock:
            self._armed.pop(token, None)

    def _main(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                while self._due and (self._due[0][1] not in self._armed):
                    heapq.heappop(self._due)  # disarmed: forgotten
                if not self._due or self._due[0][0] > now:
                    wait = IDLE if not self._due else min(IDLE, self._due[0][0] - now)
                    self._lock.wait(wait)
                    continue
                _, token = heapq.heappop(self._due)
                fire = self._armed.pop(token)
            with contextlib.suppress(Exception):  # (a socket already gone: nothing to wake)
                fire()


WATCHDOG = Watchdog()


class Poster:
    """The POSTs of one thread: its httpx2 client (kept: its connections are reused), the
    sockets that client opened, and the watchdog's deadline for each POST."""

    def __init__(
        self, client: Any, watchdog: Watchdog = WATCHDOG, resolve: Resolver = getaddrinfo
    ) -> None:
        self._client = client
        self._watchdog = watchdog
        self._resolve = resolve
        self._resolved_until: dict[tuple[str, int], float] = {}  # (host, port) -> monotonic
        self._lock = threading.Lock()  # the sockets: this thread adds, the watchdog's shuts
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        # a copy of the descriptor of each connection this POST made, kept to its end: a TLS
        # handshake takes the socket's descriptor over before its stream is known, and a
        # shutdown through the copy still wakes it (it acts on the connection, not the copy)
        self._copies: list[socket.socket] = []
        self._late = False  # the current POST's deadline has passed: new sockets are shut too
        self._posts = 0  # POSTs begun (a watchdog's late call for an earlier one does nothing)

    def _trace(self, name: str, info: Mapping[str, Any]) -> None:
        """httpcore's ``trace`` extension: each connection made (TCP, then TLS) is kept."""
        if not name.endswith(".complete"):
            return
        stream = info.get("return_value")
        getter = getattr(stream, "get_extra_info", None)
        sock = getter("socket") if getter is not None else None
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sockets.add(sock)
            if name.endswith("connect_tcp.complete"):
                with contextlib.suppress(OSError):
                    self._copies.append(sock.dup())
            if self._late:
                _shut(sock)

    def _expire(self, post: int) -> None:
        """The watchdog's, at POST ``post``'s deadline: every socket of this client is shut
        down (unless that POST is over)."""
        if post != self._posts:
            return
        with self._lock:
            self._late = True
            for sock in [*self._sockets, *self._copies]:
                _shut(sock)

    def post(self, url: str, body: bytes, headers: Mapping[str, str], limit: float) -> str | None:
        """POST ``body`` to ``url`` within ``limit`` seconds in all; None when the receiver
        took it (a 2xx answer, complete, of at most ``MAX_ANSWER`` bytes), else the reason it
        failed."""
        self._late = False
        self._posts = post = self._posts + 1
        deadline = time.monotonic() + limit
        token = self._watchdog.arm(deadline, lambda: self._expire(post))
        try:
            unresolved = self._resolved(url, deadline)
            if unresolved is not None:
                return unresolved
            return self._send(url, body, headers, limit)
        except Exception as exc:  # the network's: refused, reset, cut by the deadline ...
            if self._late or time.monotonic() >= deadline:  # (or a timeout of the library's)
                return f"no complete answer within {limit:g} s ({type(exc).__name__})"
            return f"{type(exc).__name__}: {exc}"[:MAX_ERROR]
        finally:
            self._watchdog.disarm(token)
            self._posts += 1  # (over: a late call of the watchdog for it does nothing)
            with self._lock:
                copies, self._copies = self._copies, []
            for copy in copies:
                copy.close()

    def _resolved(self, url: str, deadline: float) -> str | None:
        """Resolve ``url``'s host within the POST's deadline, in a thread of its own (the
        lookup cannot be interrupted); None when it resolved (or is an address), else why not."""
        parts = urlsplit(url)
        host = parts.hostname
        if not host or _is_address(host):
            return None
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if self._resolved_until.get((host, port), 0.0) > time.monotonic():
            return None  # resolved lately: its connection is most likely reused (no lookup)
        done = threading.Event()
        failure: list[str] = []

        def lookup() -> None:
            try:
                self._resolve(host, port)
            except OSError as exc:
                failure.append(f"cannot resolve {host!r}: {exc}"[:MAX_ERROR])
            finally:
                done.set()

        threading.Thread(target=lookup, name="leasekeeper-resolve", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            return f"cannot resolve {host!r} within the POST's deadline"
        if failure:
            return failure[0]
        self._resolved_until[(host, port)] = time.monotonic() + RESOLVED_FOR
        return None

    def _send(self, url: str, body: bytes, headers: Mapping[str, str], limit: float) -> str | None:
        client = self._client
        request = client.build_request(
            "POST", url, content=body, headers=dict(headers), timeout=limit,
            extensions={"trace": self._trace},
        )  # fmt: skip
        reply = client.send(request, stream=True)
        try:
            status = int(reply.status_code)
            if not 200 <= status < 300:
                redirect = ": redirects are not followed" if 300 <= status < 400 else ""
                return f"HTTP {status}{redirect}"
            size = 0
            for piece in reply.iter_raw(PIECE):
                size += len(piece)
                if size > MAX_ANSWER:
                    return (f"HTTP {status} with an answer longer than {MAX_ANSWER} bytes "
                            "(not read further)")  # fmt: skip
            return None  # (complete: taken, even if the deadline came just after)
        finally:
            reply.close()


def _is_address(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host.partition("%")[0])
    except OSError:
        return False
    return True


def _shut(sock: socket.socket) -> None:
    """Wake whatever waits on ``sock`` (the plain socket's shutdown, also for a TLS one: its
    TLS state is left to the thread that reads it)."""
    with contextlib.suppress(OSError):  # (closed meanwhile)
        if sock.fileno() != -1:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
