"""A small Server-Sent Events client for tests: one ``GET /events/stream`` on its own
connection, read message by message (every read bounded by the socket's timeout)."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


class EventStreamClient:
    def __init__(self, url: str, path: str = "/events/stream",
                 headers: dict[str, str] | None = None, timeout: float = 30.0) -> None:  # fmt: skip
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
        self.conn.request("GET", path, headers=headers or {})
        self.response = self.conn.getresponse()
        self.status = self.response.status

    def message(self) -> dict[str, str]:
        """The next message's fields (a comment as ``comment``); {} at the end of the stream."""
        fields: dict[str, str] = {}
        while True:
            line = self.response.readline()
            if not line:
                return fields
            text = line.decode().rstrip("\n")
            if text == "":
                if fields:
                    return fields
                continue
            name, _, value = text.partition(":")
            fields[name or "comment"] = value.removeprefix(" ")

    def event(self) -> dict[str, Any]:
        """The next event's JSON, skipping comments and messages without data."""
        while True:
            fields = self.message()
            if not fields:
                raise AssertionError("the stream ended")
            if "data" in fields:
                doc: dict[str, Any] = json.loads(fields["data"])
                assert fields["id"] == str(doc["id"]) and fields["event"] == doc["kind"]
                return doc

    def close(self) -> None:
        self.conn.close()
