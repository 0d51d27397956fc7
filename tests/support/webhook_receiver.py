"""A local webhook receiver for the delivery tests: a real HTTP server on a thread of the test
process that checks each delivery's signature, records it, and can be told to fail a share of
requests (HTTP 503, drawn from a seeded generator) or to go down (its socket closed: connections
are refused) and come back on the same port."""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workerproc.webhooks import HEADER, SignatureError, verify


@dataclass(frozen=True)
class Delivery:
    event: dict[str, Any]
    accepted: bool  # answered 2xx (a failed one was refused on purpose)
    signed: bool  # the signature verified
    event_header: str | None


class Receiver:
    def __init__(self, secret: str, *, fail_share: float = 0.0, seed: int = 7) -> None:
        self.secret = secret
        self.fail_share = fail_share
        self._random = random.Random(seed)
        self.lock = threading.Lock()
        self.deliveries: list[Delivery] = []
        self.unreadable = 0  # requests whose body was not JSON (refused with 400)
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    event = json.loads(body)
                except ValueError:  # cut short (the receiver going down under it): refused
                    with receiver.lock:
                        receiver.unreadable += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                try:
                    verify(receiver.secret, self.headers.get(HEADER), body)
                    signed = True
                except SignatureError:
                    signed = False
                with receiver.lock:
                    fail = receiver._random.random() < receiver.fail_share
                    header = self.headers.get("Leasekeeper-Event")
                    receiver.deliveries.append(Delivery(event, not fail, signed, header))
                self.send_response(503 if fail else 204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()  # fmt: skip

    def down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def accepted(self) -> list[dict[str, Any]]:
        with self.lock:
            return [d.event for d in self.deliveries if d.accepted]

    def all(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)
