"""Local servers for the webhook POST's tests (``tests/unit/test_poster*.py``), each on
threads of the test, real sockets: ``Server``, a receiver; ``ForwardProxy``, an HTTP proxy
(``CONNECT`` tunnels, and absolute-URI requests passed on); ``self_signed``, a certificate."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

PROXY_VARIABLES = [case(f"{name}_proxy") for name in ("http", "https", "all", "no")
                   for case in (str.lower, str.upper)]  # fmt: skip


class _Listening:
    """A listener on 127.0.0.1 whose every accepted connection is served on a thread of its
    own (``_serve``); counts them, and ``stop`` closes the listener and them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # (wakes the accept: a close alone leaves it listening)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self._open:
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError


class Server(_Listening):
    """An HTTP/1.1 receiver on a raw socket: answers each request ``204`` (``close``: then
    closes the connection, with no ``Connection: close`` said), records the connections it
    accepted and each request's head; TLS with ``tls``."""

    def __init__(self, *, close: bool = False, tls: ssl.SSLContext | None = None) -> None:
        self.close_after, self.tls = close, tls
        self.heads: list[bytes] = []
        self.failures: list[str] = []
        super().__init__()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/in?x=1"

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10.0)
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    piece = conn.recv(4096)
                    if not piece:
                        return
                    data += piece
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))  # fmt: skip
                while len(data) < length:
                    data += conn.recv(4096)
                self.heads.append(head)
                data = data[length:]
                conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
                if self.close_after:
                    return
        except (OSError, ssl.SSLError) as exc:
            self.failures.append(repr(exc))
        finally:
            with contextlib.suppress(OSError):
                conn.close()


def self_signed(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl's command), and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True,
                   capture_output=True)  # fmt: skip
    return cert, key


REASONS = {"403": "Forbidden", "407": "Proxy Authentication Required"}


class ForwardProxy(_Listening):
    """An HTTP proxy. ``CONNECT host:port``: with ``answer`` "200", answers 200 and splices
    bytes both ways with a connection it makes to host:port; "hang": says nothing; "hang_after":
    answers 200, then relays nothing; else that status, and closes. Any other request (an
    absolute URI): passed on unchanged with what follows on its connection, to the URI's host.
    Records the connections it accepted and the first head of each."""

    def __init__(self, answer: str = "200") -> None:
        self.answer = answer
        self.heads: list[str] = []
        super().__init__()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10.0)
        data = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in data:
                piece = conn.recv(4096)
                if not piece:
                    return
                data += piece
            head = data.partition(b"\r\n\r\n")[0].decode("latin-1")
            self.heads.append(head)
            method, target, _ = head.split("\r\n")[0].split(" ")
            if method != "CONNECT":
                host, _, port = target.split("/")[2].rpartition(":")
                self._splice(conn, socket.create_connection((host, int(port))), data)
            elif self.answer == "200":
                host, _, port = target.rpartition(":")
                onward = socket.create_connection((host, int(port)))
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self._splice(conn, onward, b"")
            elif self.answer.startswith("hang"):
                if self.answer == "hang_after":
                    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                while conn.recv(4096):
                    pass
            else:
                reason = REASONS[self.answer]
                conn.sendall(f"HTTP/1.1 {self.answer} {reason}\r\nContent-Length: 0\r\n"
                             "Connection: close\r\n\r\n".encode())  # fmt: skip
                conn.close()

    def _splice(self, conn: socket.socket, onward: socket.socket, first: bytes) -> None:
        self._open.append(onward)
        onward.sendall(first)

        def pump(source: socket.socket, sink: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while piece := source.recv(65536):
                    sink.sendall(piece)
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(onward, conn), daemon=True).start()
        pump(conn, onward)
