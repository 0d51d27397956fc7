"""A webhook POST's deadline covers resolving the receiver's name: a resolver that hangs or
fails is the POST's failure, with its reason, within the deadline; an address is never
looked up; a name that resolves is delivered as before. Real sockets, the real
``http.client``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from webhook_receiver import Receiver

from workerproc.posting import Poster, getaddrinfo
from workerproc.webhooks import HEADER, signature_header

SECRET = "resolve-secret"
LIMIT = 0.5
SLACK = 2.0  # what a loaded 2-core machine may add


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET)
    yield r
    r.down()


def body() -> tuple[bytes, dict[str, str]]:
    raw = json.dumps({"id": 1, "kind": "run.succeeded"}).encode()
    return raw, {"content-type": "application/json", HEADER: signature_header(SECRET, raw)}


def test_a_resolver_that_hangs_fails_the_post_within_its_deadline() -> None:
    release = threading.Event()
    asked: list[tuple[str, int]] = []

    def hung(host: str, port: int) -> object:
        asked.append((host, port))
        release.wait(30)
        return []

    raw, headers = body()
    began = time.monotonic()
    reason = Poster(resolve=hung).post("https://hooks.example.test/x", raw, headers, LIMIT)
    took = time.monotonic() - began
    release.set()
    assert reason == "cannot resolve 'hooks.example.test' within the POST's deadline"
    assert asked == [("hooks.example.test", 443)]
    assert LIMIT * 0.9 <= took < LIMIT + SLACK


def test_a_name_that_does_not_resolve_is_a_failure_with_its_reason() -> None:
    def unknown(host: str, port: int) -> object:
        raise OSError(-2, "Name or service not known")

    raw, headers = body()
    reason = Poster(resolve=unknown).post("http://nowhere.test:8080/", raw, headers, LIMIT)
    assert reason == "cannot resolve 'nowhere.test': [Errno -2] Name or service not known"


def test_an_address_is_posted_to_without_a_lookup_and_a_name_after_one(receiver: Receiver) -> None:
    def never(host: str, port: int) -> object:
        raise AssertionError(f"looked up {host}")

    looked: list[str] = []

    def real(host: str, port: int) -> object:
        looked.append(host)
        return getaddrinfo(host, port)

    raw, headers = body()
    assert Poster(resolve=never).post(receiver.url, raw, headers, 5.0) is None
    by_name = receiver.url.replace("127.0.0.1", "localhost")
    poster = Poster(resolve=real)
    assert poster.post(by_name, raw, headers, 5.0) is None
    assert poster.post(by_name, raw, headers, 5.0) is None  # resolved lately: no lookup
    assert looked == ["localhost"] and len(receiver.accepted()) == 3
