"""The dashboard's connection guard (supervisor/web/connections.py), rule by rule, on a real
uvicorn server in a thread with small bounds, serving an app of the test's own (one route
answers at once, one waits until the test lets it go). The timeout's rules run with a short
request timeout; the bounds' rules with one far longer than any wait of theirs, so only the
bound can have closed a connection (and a loaded machine's pauses cannot)."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from helpers import wait_for

from supervisor.web.connections import Connections, guarded_protocol

TIMEOUT = 0.5  # the request timeout of the ``server`` fixture
LONG_TIMEOUT = 100.0  # the ``bounded`` fixture's: past every wait_for below (30 s)
PER_CLIENT, LIMIT = 3, 5


class App:
    """``/fast`` answers at once; ``/slow`` after ``release`` is set; ``/early`` at once,
    without reading the body (as a 401 or a 413 does)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        while scope["path"] != "/early" and (await receive()).get("more_body"):
            pass
        if scope["path"] == "/slow":
            self.started += 1
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        body = scope["path"].encode()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server() -> Iterator[tuple[tuple[str, int], App]]:
    with serving(TIMEOUT) as running:
        yield running


@pytest.fixture
def bounded() -> Iterator[tuple[tuple[str, int], App]]:
    with serving(LONG_TIMEOUT) as running:
        yield running


@contextlib.contextmanager
def serving(request_timeout: float) -> Iterator[tuple[tuple[str, int], App]]:
    app = App()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    protocol = guarded_protocol(Connections(LIMIT, PER_CLIENT), request_timeout)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", http=protocol)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve(sockets=[sock])), daemon=True)
    thread.start()
    wait_for(lambda: srv.started, timeout=30, what="the test server")
    try:
        yield sock.getsockname(), app
    finally:
        app.release.set()
        srv.should_exit = True
        thread.join(30)
        sock.close()


def connect(
    target: tuple[str, int], source: str = "127.0.0.1", first: bytes = b""
) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(30)
    sock.connect(target)
    if first:
        sock.sendall(first)
    return sock


def is_closed(sock: socket.socket) -> bool:
    """The server closed ``sock`` (EOF or reset), without sending anything first."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def request(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return response(sock)


def response(sock: socket.socket) -> bytes:
    """One whole response (the app always sends Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        body += sock.recv(4096)
    return data


def test_a_head_that_never_ends_is_closed_after_the_timeout(server: Any) -> None:
    target, _ = server
    sock = connect(target, first=b"GET /fast HTTP/1.1\r\n")
    started = time.monotonic()
    wait_for(lambda: is_closed(sock), timeout=30, what="the server to close it")
    assert time.monotonic() - started >= TIMEOUT * 0.8


def test_a_byte_at_a_time_does_not_renew_the_timeout(server: Any) -> None:
    target, _ = server
    sock = connect(target)
    started = time.monotonic()
    head = b"GET /fast HTTP/1.1\r\nX-Slow: " + b"a" * 1000
    for byte in head:  # 1000 bytes over 10 s at most: far past the timeout
        try:
            sock.send(bytes([byte]))
        except OSError:
            break
        if is_closed(sock):
            break
        time.sleep(0.01)
    assert is_closed(sock) or wait_for(lambda: is_closed(sock), timeout=30)
    assert time.monotonic() - started < 10


def test_a_body_that_never_ends_is_closed_after_the_timeout(server: Any) -> None:
    target, _ = server
    sock = connect(target, first=b"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
    wait_for(lambda: is_closed(sock), timeout=30, what="the server to close it")


def test_between_requests_the_timeout_starts_again(server: Any) -> None:
    target, _ = server
    sock = connect(target)
    for _ in range(3):  # keep-alive: each request in time is served
        assert request(sock, "/fast").startswith(b"HTTP/1.1 200")
        time.sleep(TIMEOUT / 5)
    sock.sendall(b"GET /fast HTTP/1.1\r\n")  # and a head that never ends, after a response
    wait_for(lambda: is_closed(sock), timeout=30, what="the server to close it")


def test_the_handlers_own_time_is_not_counted(server: Any) -> None:
    target, app = server
    sock = connect(target)
    sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for(lambda: app.started == 1, timeout=30)
    time.sleep(TIMEOUT * 3)
    assert not is_closed(sock)
    app.release.set()
    assert response(sock).startswith(b"HTTP/1.1 200")


def test_a_client_over_its_bound_loses_its_oldest_idle_connection(bounded: Any) -> None:
    target, _ = bounded
    idle = [connect(target, first=b"GET / HTTP/1.1\r\n") for _ in range(PER_CLIENT)]
    fresh = connect(target)
    wait_for(lambda: is_closed(idle[0]), timeout=30, what="the oldest idle one closed")
    assert not any(is_closed(s) for s in idle[1:])
    assert request(fresh, "/fast").startswith(b"HTTP/1.1 200")


def test_busy_connections_are_never_closed_to_make_room(bounded: Any) -> None:
    target, app = bounded
    busy = [connect(target) for _ in range(PER_CLIENT)]
    for sock in busy:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for(lambda: app.started == PER_CLIENT, timeout=30)
    refused = connect(target)
    wait_for(lambda: is_closed(refused), timeout=30, what="the newcomer refused")
    other = connect(target, source="127.0.0.2")  # another client still gets in
    assert request(other, "/fast").startswith(b"HTTP/1.1 200")
    app.release.set()
    for sock in busy:
        assert response(sock).startswith(b"HTTP/1.1 200")


def test_all_clients_together_are_bounded_too(bounded: Any) -> None:
    target, _ = bounded
    idle = [connect(target, source=f"127.0.0.{10 + i}", first=b"GET / HTTP/1.1\r\n")
            for i in range(LIMIT)]  # fmt: skip
    fresh = connect(target, source="127.0.0.99")
    wait_for(lambda: is_closed(idle[0]), timeout=30, what="the oldest idle one closed")
    assert request(fresh, "/fast").startswith(b"HTTP/1.1 200")
    with contextlib.suppress(OSError):
        for sock in idle:
            sock.close()


def test_a_connection_still_sending_its_body_makes_room_before_an_idle_one(bounded: Any) -> None:
    """Bodies trickled a byte a second held every slot, and only idle connections
    could make room. A request still sending its body is closed first (the oldest), then an
    idle one; a request whose head is in and that has no body is served."""
    target, _ = bounded
    idle = connect(target, first=b"GET / HTTP/1.1\r\n")  # the oldest
    head = b"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 16000\r\n\r\nab"
    bodies = [connect(target, first=head) for _ in range(PER_CLIENT - 1)]
    time.sleep(0.2)  # every head is in
    fresh = connect(target)
    wait_for(lambda: is_closed(bodies[0]), timeout=30, what="the oldest body closed")
    assert not is_closed(idle) and not is_closed(bodies[1])
    assert request(fresh, "/fast").startswith(b"HTTP/1.1 200")
    newer = connect(target)  # again: the other body goes, still not the idle socket
    wait_for(lambda: is_closed(bodies[1]), timeout=30, what="the next body closed")
    assert not is_closed(idle)
    assert request(newer, "/fast").startswith(b"HTTP/1.1 200")


def test_an_answer_sent_before_the_body_is_in_closes_the_connection(bounded: Any) -> None:
    """A 401 or 413 answered from the head: the rest of the body is never waited for (the
    request timeout here is far longer than the wait)."""
    target, _ = bounded
    sock = connect(
        target, first=b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab"
    )
    assert response(sock).startswith(b"HTTP/1.1 200")
    # at once: before uvicorn's keep-alive timeout (5 s) would have closed it
    wait_for(lambda: is_closed(sock), timeout=3, what="the connection closed")
