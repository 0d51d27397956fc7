"""The real dashboard against slow and greedy clients: 64 sockets that each
sent ``GET / HTTP/1.1\\r\\n`` and nothing more made every other client get 503 for as long as
they stayed open. Now its pages answer while 500 such sockets are open — from one client
address or spread over twenty — a forged ``Host`` still gets 400, the server holds no more
connections than its bounds, and every idle socket is closed once its request timeout passes.
(The guard's rules one by one, with small bounds: test_web_connections.py.)"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import wait_for
from web_process import WebProcess

from supervisor.web.connections import MAX_CONNECTIONS, PER_CLIENT, REQUEST_TIMEOUT
from workerproc.store import open_store

pytestmark = pytest.mark.slow

IDLE = 500
PAGE_BOUND = 10.0  # seconds for a page while the idle sockets are open (it takes milliseconds)


@pytest.fixture
def web(tmp_path: Path) -> Iterator[WebProcess]:
    db = str(tmp_path / "lk.db")
    with open_store(db) as store:
        store.start_run("t")
    proc = WebProcess(tmp_path, "--db", db, "--port", "0")
    try:
        proc.url()
        yield proc
    finally:
        proc.kill()


def address(web: WebProcess) -> tuple[str, int]:
    host, port = web.url().removeprefix("http://").rstrip("/").rsplit(":", 1)
    return host, int(port)


def open_idle(target: tuple[str, int], sources: list[str]) -> list[socket.socket]:
    """IDLE sockets, round-robin over ``sources``, each having sent the first line of a head."""
    socks = []
    for i in range(IDLE):
        sock = socket.socket()
        socks.append(sock)
        sock.bind((sources[i % len(sources)], 0))
        sock.settimeout(30)
        sock.connect(target)
        with contextlib.suppress(OSError):  # the server may have closed it already
            sock.sendall(b"GET / HTTP/1.1\r\n")
    return socks


def closed_by_server(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server closed (EOF or reset waiting to be read)."""
    closed = 0
    for sock in socks:
        if sock.fileno() < 0:
            closed += 1
            continue
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            try:
                data = sock.recv(4096, socket.MSG_PEEK)
            except OSError:
                data = b""
            if not data:
                closed += 1
                sock.close()
    return closed


def server_connections(web: WebProcess) -> int:
    """Established TCP connections the dashboard process holds."""
    conns = psutil.Process(web.proc.pid).net_connections(kind="tcp")
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED)


@pytest.mark.e2e  # over ten seconds: scripts/test-e2e
@pytest.mark.parametrize(
    ("sources", "held"),
    [(["127.0.0.1"], PER_CLIENT), ([f"127.0.0.{i}" for i in range(2, 22)], MAX_CONNECTIONS)],
    ids=["one-client", "twenty-clients"],
)
def test_pages_answer_while_500_idle_sockets_are_open(
    web: WebProcess, sources: list[str], held: int
) -> None:
    socks = open_idle(address(web), sources)
    try:
        opened = time.monotonic()
        assert web.get("/", {"Host": "evil.example"})[0] == 400  # a forged Host, meanwhile
        for path in ("/", "/runs", "/runs/1", "/leases", "/static/dashboard.css"):
            started = time.monotonic()
            status, _ = web.get(path)
            took = time.monotonic() - started
            assert status == 200 and took < PAGE_BOUND, (path, status, took)
        # the server holds no more than its bound, whatever the clients keep open
        wait_for(lambda: server_connections(web) <= held, timeout=30, what="the guard's bound")
        assert closed_by_server(socks) >= IDLE - held
        # and the rest once their request timeout has passed (nothing renews it)
        wait_for(lambda: closed_by_server(socks) == IDLE, timeout=REQUEST_TIMEOUT + 60,
                 what="every idle socket closed by the server")  # fmt: skip
        assert time.monotonic() - opened >= REQUEST_TIMEOUT * 0.9  # not before it
        assert web.get("/runs")[0] == 200
    finally:
        for sock in socks:
            sock.close()
    assert web.stop() == 0
    assert "Traceback" not in web.stderr()
