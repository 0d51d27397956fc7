"""A local webhook receiver for the delivery tests: a real HTTP server on a thread of the test
process that checks each delivery's signature, records it, and can be told to fail a share of
requests (HTTP 503, drawn from a seeded generator) or to go down (its socket closed: connections
are refused) and come back on the same port. It counts the requests open at once (``most``: the
peak), each held ``hold`` seconds before its answer so that those sent together overlap."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workerproc.webhooks import HEADER, SignatureError, verify

# the webhooks' secret the worker tests sign with (tests/worker/conftest.py's receiver)
SECRET = "s3cret-for-tests"


@dataclass(frozen=True)
class Delivery:
    event: dict[str, Any]
    accepted: bool  # answered 2xx (a failed one was refused on purpose)
    signed: bool  # the signature verified
    event_header: str | None


class Receiver:
    def __init__(
        self, secret: str, *, fail_share: float = 0.0, seed: int = 7, hold: float = 0.0
    ) -> None:
        self.secret = secret
        self.fail_share = fail_share
        self.hold = hold
        self.open = 0  # requests being handled now
        self.most = 0  # the most handled at once
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
                with receiver.lock:
                    receiver.open += 1
                    receiver.most = max(receiver.most, receiver.open)
                try:
                    if receiver.hold:
                        time.sleep(receiver.hold)
                    code = self.take()
                finally:  # (closed before its answer goes: the sender's next may come at once)
                    with receiver.lock:
                        receiver.open -= 1
                self.send_response(code)
                self.end_headers()

            def take(self) -> int:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    event = json.loads(body)
                except ValueError:  # cut short (the receiver going down under it): refused
                    with receiver.lock:
                        receiver.unreadable += 1
                    return 400
                try:
                    verify(receiver.secret, self.headers.get(HEADER), body)
                    signed = True
                except SignatureError:
                    signed = False
                with receiver.lock:
                    fail = receiver._random.random() < receiver.fail_share
                    header = self.headers.get("Leasekeeper-Event")
                    receiver.deliveries.append(Delivery(event, not fail, signed, header))
                return 503 if fail else 204

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
