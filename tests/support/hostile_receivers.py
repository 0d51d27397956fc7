"""Hostile webhook receivers for the delivery tests: real sockets on threads of the
test process, each reading a whole request and then answering badly:

- ``flood``: 200 with a chunked body that never ends (16 KiB chunks until the socket breaks);
- ``trickle_head``: the whole answer, status line and headers too, one byte every ``pace`` s;
- ``trickle_body``: the head at once, then a 1,000-byte body one byte every ``pace`` s;
- ``hang``: nothing at all, the connection held open;
- ``redirect``: 307 to ``location``;
- ``tls_trickle``: for an ``https://`` URL: a TLS record header, then its body, one byte every
  ``pace`` s (the client's handshake waits for the whole record).

``requests`` counts the requests read in full; ``busy`` how many connections are being
answered right now (a test waits for a POST in hand)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

BEHAVIOURS = ("flood", "trickle_head", "trickle_body", "hang", "redirect", "tls_trickle")
CHUNK = 16 * 1024


class HostileReceiver:
    def __init__(self, behaviour: str, *, pace: float = 0.3, location: str = "") -> None:
        assert behaviour in BEHAVIOURS, behaviour
        self.behaviour, self.pace, self.location = behaviour, pace, location
        self._server = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        self.requests = 0
        self.busy = 0
        self.sent = 0  # bytes of answers sent
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        scheme = "https" if self.behaviour == "tls_trickle" else "http"
        return f"{scheme}://127.0.0.1:{self._server.getsockname()[1]}/hook"

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        with self._lock:
            held, self._held = self._held, []
        for conn in held:
            with contextlib.suppress(OSError):
                conn.close()

    def wait_busy(self, timeout: float = 30.0) -> None:
        """Until a POST is in hand (read, being answered)."""
        end = time.monotonic() + timeout
        while self.busy == 0:
            assert time.monotonic() < end, f"no POST reached the {self.behaviour} receiver"
            time.sleep(0.02)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._held.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(60.0)
        if self.behaviour == "tls_trickle":
            self._tls_trickle(conn)
            return
        try:
            while not self._stop.is_set() and self._read_request(conn):
                with self._lock:
                    self.requests += 1
                    self.busy += 1
                try:
                    if not self._answer(conn):
                        return
                finally:
                    with self._lock:
                        self.busy -= 1
        except OSError:  # the client gave up (as it should): this connection is over
            return

    def _tls_trickle(self, conn: socket.socket) -> None:
        with self._lock:
            self.requests += 1
            self.busy += 1
        try:
            # a handshake record of 16 KiB: the client reads all of it before it can parse any
            for byte in b"\x16\x03\x03\x40\x00" + b"x" * 0x4000:
                if self._stop.wait(self.pace):
                    return
                self._send(conn, bytes([byte]))
        except OSError:
            return
        finally:
            with self._lock:
                self.busy -= 1

    @staticmethod
    def _read_request(conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            piece = conn.recv(4096)
            if not piece:
                return False
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            piece = conn.recv(4096)
            if not piece:
                return False
            body += piece
        return True

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def _answer(self, conn: socket.socket) -> bool:
        """Answer one request; whether the connection may carry another."""
        kind, pace = self.behaviour, self.pace
        if kind == "flood":
            self._send(conn, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n" % CHUNK + b"x" * CHUNK + b"\r\n"
            while not self._stop.is_set():
                self._send(conn, chunk)
            return False
        if kind == "trickle_head":
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
                if self._stop.wait(pace):
                    return False
                self._send(conn, bytes([byte]))
            return True
        if kind == "trickle_body":
            self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            for _ in range(1000):
                if self._stop.wait(pace):
                    return False
                self._send(conn, b"x")
            return True
        if kind == "hang":
            self._stop.wait(120.0)
            return False
        location = self.location.encode()
        self._send(conn, b"HTTP/1.1 307 Temporary Redirect\r\nLocation: " + location
                   + b"\r\nContent-Length: 0\r\n\r\n")  # fmt: skip
        return True
