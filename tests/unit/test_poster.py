"""The webhook POST on ``http.client`` (``workerproc/posting.py::Poster``), against real local
servers on threads of the test (no client mocked): one deadline over the whole POST however the
receiver trickles, at most 64 KiB of an answer read, a redirect refused (never followed), a
keep-alive connection reused, a connection the receiver closed opened again, TLS verified."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_receivers import HostileReceiver
from poster_servers import PROXY_VARIABLES, Server, self_signed

from workerproc.posting import MAX_ANSWER, Poster

LIMIT = 0.6
SLACK = 2.0  # what a loaded 2-core machine may add
BODY = b'{"id":1}'
HEADERS = {"Content-Type": "application/json", "User-Agent": "leasekeeper/test",
           "Leasekeeper-Signature": "t=1,v1=" + "0" * 64}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Straight to the receivers, whatever the environment the tests run in names."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.stop()


@pytest.mark.parametrize("behaviour", ["trickle_head", "trickle_body", "hang", "tls_trickle"])
def test_a_receiver_that_trickles_is_cut_at_the_posts_deadline(behaviour: str) -> None:
    hostile = HostileReceiver(behaviour, pace=0.05)  # a byte every 50 ms: no read ever waits long
    try:
        began = time.monotonic()
        reason = Poster().post(hostile.url, BODY, HEADERS, LIMIT)
        took = time.monotonic() - began
    finally:
        hostile.close()
    assert reason is not None and reason.startswith(f"no complete answer within {LIMIT:g} s")
    assert LIMIT * 0.9 <= took < LIMIT + SLACK


def test_an_answer_over_the_limit_is_a_failure_and_is_not_read_further() -> None:
    hostile = HostileReceiver("flood")
    try:
        reason = Poster().post(hostile.url, BODY, HEADERS, 10.0)
    finally:
        hostile.close()
    assert reason == f"HTTP 200 with an answer longer than {MAX_ANSWER} bytes (not read further)"


def test_an_answer_of_the_limit_exactly_is_taken() -> None:
    hostile = HostileReceiver("trickle_body", pace=0.0)  # 1,000 bytes at once
    try:
        assert Poster().post(hostile.url, BODY, HEADERS, 10.0) is None
    finally:
        hostile.close()


def test_a_redirect_is_refused_and_never_followed(server: Server) -> None:
    hostile = HostileReceiver("redirect", location=server.url())
    try:
        reason = Poster().post(hostile.url, BODY, HEADERS, 10.0)
    finally:
        hostile.close()
    assert reason == "HTTP 307: redirects are not followed"
    assert server.heads == []


def test_one_connection_carries_every_post_with_the_headers_given(server: Server) -> None:
    poster = Poster()
    for _ in range(5):
        assert poster.post(server.url(), BODY, HEADERS, 5.0) is None
    assert server.connections == 1 and len(server.heads) == 5
    head = server.heads[0].decode()
    assert head.startswith("POST /in?x=1 HTTP/1.1\r\n")
    for line in (f"Host: 127.0.0.1:{server.port}", "User-Agent: leasekeeper/test",
                 "Content-Type: application/json", f"Content-Length: {len(BODY)}",
                 HEADERS["Leasekeeper-Signature"]):  # fmt: skip
        assert line in head
    poster.close()


def test_a_connection_the_receiver_closed_is_opened_again() -> None:
    closing = Server(close=True)
    try:
        poster = Poster()
        for _ in range(3):
            assert poster.post(closing.url(), BODY, HEADERS, 5.0) is None
            time.sleep(0.05)  # (the close reaches the client before the next POST)
        assert closing.connections == 3 and len(closing.heads) == 3
    finally:
        closing.stop()


def test_a_connection_opened_again_uses_the_posts_lookup_never_one_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every new connection connects to what the POST's bounded lookup answered: a lookup of
    its own would be outside the deadline (``getaddrinfo`` takes no timeout)."""
    closing = Server(close=True)
    looked: list[str] = []
    found = socket.getaddrinfo("127.0.0.1", closing.port, type=socket.SOCK_STREAM)

    def resolve(host: str, port: int) -> list[tuple[object, ...]]:
        looked.append(host)
        return list(found)

    def unbounded(host: str, *args: object, **kwargs: object) -> object:
        raise AssertionError(f"a lookup outside the deadline: {host}")

    try:
        poster = Poster(resolve=resolve)
        monkeypatch.setattr(socket, "getaddrinfo", unbounded)
        for _ in range(3):
            assert poster.post(closing.url("hooks.example.test"), BODY, HEADERS, 5.0) is None
            time.sleep(0.05)  # (the close reaches the client before the next POST)
        assert closing.connections == 3 and looked == ["hooks.example.test"]
    finally:
        closing.stop()


def test_a_refused_connection_is_a_connect_error() -> None:
    gone = Server()
    url = gone.url()
    gone.stop()  # (nothing listens on its port now)
    reason = Poster().post(url, BODY, HEADERS, 5.0)
    assert reason is not None and reason.startswith("ConnectError: "), reason
    assert "Connection refused" in reason


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


def test_https_verifies_the_certificate_and_its_host(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    side.load_cert_chain(cert, key)
    tls = Server(tls=side)
    try:
        # the system's authorities: a self-signed certificate is refused
        reason = Poster().post(tls.url(), BODY, HEADERS, 5.0)
        assert reason is not None and "CERTIFICATE_VERIFY_FAILED" in reason, reason
        trusting = ssl.create_default_context(cafile=str(cert))
        poster = Poster(tls=lambda: trusting)
        assert poster.post(tls.url(), BODY, HEADERS, 5.0) is None
        assert poster.post(tls.url(), BODY, HEADERS, 5.0) is None
        assert tls.connections == 2 and len(tls.heads) == 2  # (the refused one's, then one)
        # trusted, but not for that name: refused too
        reason = poster.post(tls.url("localhost"), BODY, HEADERS, 5.0)
        assert reason is not None and "CERTIFICATE_VERIFY_FAILED" in reason, reason
        assert len(tls.heads) == 2
    finally:
        tls.stop()
