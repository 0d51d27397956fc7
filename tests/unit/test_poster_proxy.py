"""The webhook POST through the proxy the standard variables name (``workerproc/proxies.py``,
``workerproc/posting.py::Poster``), against a real local proxy and receivers on threads of the
test: an ``https://`` receiver through a ``CONNECT`` tunnel (TLS checked against the receiver's
name), an ``http://`` one by its absolute URI, ``NO_PROXY`` bypassed (a direct connection never
mixed with a proxied one), the deadline over a proxy that hangs, a refused tunnel's reason."""

from __future__ import annotations

import base64
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_receivers import HostileReceiver
from poster_servers import PROXY_VARIABLES, ForwardProxy, Server, self_signed

from workerproc.posting import MAX_ANSWER, Poster
from workerproc.proxies import Proxies, ProxyUnsupported

LIMIT = 0.6
SLACK = 2.0  # what a loaded 2-core machine may add
BODY = b'{"id":1}'
HEADERS = {"Content-Type": "application/json", "Leasekeeper-Signature": "t=1,v1=" + "0" * 64}
BASIC = "Proxy-Authorization: Basic " + base64.b64encode(b"me:p@ss word").decode()


@pytest.fixture(autouse=True)
def _no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def receiver(certificate: tuple[Path, Path]) -> Iterator[Server]:
    """An https:// receiver whose certificate (for 127.0.0.1) the test trusts."""
    side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    side.load_cert_chain(*certificate)
    s = Server(tls=side)
    yield s
    s.stop()


@pytest.fixture
def trusting(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificate[0]))


@pytest.fixture
def plain() -> Iterator[Server]:
    s = Server()
    yield s
    s.stop()


def proxy(answer: str = "200") -> ForwardProxy:
    return ForwardProxy(answer)


def test_https_goes_through_a_connect_tunnel_with_the_receivers_name_checked(
    monkeypatch: pytest.MonkeyPatch, receiver: Server, trusting: ssl.SSLContext
) -> None:
    tunnel = proxy()
    try:
        monkeypatch.setenv("HTTPS_PROXY", f"http://me:p%40ss%20word@127.0.0.1:{tunnel.port}")
        poster = Poster(tls=lambda: trusting)
        for _ in range(3):
            assert poster.post(receiver.url(), BODY, HEADERS, 5.0) is None
        assert tunnel.connections == 1 and receiver.connections == 1  # kept alive, tunnelled
        assert len(receiver.heads) == 3
        connect = tunnel.heads[0]
        assert connect.startswith(f"CONNECT 127.0.0.1:{receiver.port} HTTP/")
        assert BASIC in connect and f"Host: 127.0.0.1:{receiver.port}" in connect
        head = receiver.heads[0].decode()
        assert head.startswith("POST /in?x=1 HTTP/1.1\r\n")  # (origin form, in the tunnel)
        assert f"Host: 127.0.0.1:{receiver.port}" in head
        assert "Proxy-Authorization" not in head  # (the proxy's, never the receiver's)
        # the certificate is checked against the receiver's name, not the proxy's
        reason = poster.post(receiver.url("localhost"), BODY, HEADERS, 5.0)
        assert reason is not None and "CERTIFICATE_VERIFY_FAILED" in reason, reason
        poster.close()
    finally:
        tunnel.stop()


def test_http_goes_to_the_proxy_by_its_absolute_uri(
    monkeypatch: pytest.MonkeyPatch, plain: Server
) -> None:
    forward = proxy()
    try:
        # (no scheme: http)
        monkeypatch.setenv("http_proxy", f"me:p%40ss%20word@127.0.0.1:{forward.port}")
        poster = Poster()
        for _ in range(2):
            assert poster.post(plain.url(), BODY, HEADERS, 5.0) is None
        assert forward.connections == 1 and len(plain.heads) == 2
        head = plain.heads[0].decode()
        assert head.startswith(f"POST http://127.0.0.1:{plain.port}/in?x=1 HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{plain.port}" in head and BASIC in head
        poster.close()
    finally:
        forward.stop()


@pytest.mark.parametrize("behaviour", ["redirect", "flood"])
def test_through_a_proxy_a_redirect_is_refused_and_an_answer_is_bounded(
    monkeypatch: pytest.MonkeyPatch, plain: Server, behaviour: str
) -> None:
    forward = proxy()
    hostile = HostileReceiver(behaviour, location=plain.url())
    try:
        monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{forward.port}")
        reason = Poster().post(hostile.url, BODY, HEADERS, 10.0)
        assert forward.connections == 1
    finally:
        hostile.close()
        forward.stop()
    assert reason == {"redirect": "HTTP 307: redirects are not followed",
                      "flood": f"HTTP 200 with an answer longer than {MAX_ANSWER} bytes "
                               "(not read further)"}[behaviour]  # fmt: skip
    assert plain.heads == []


def test_no_proxy_goes_straight_and_never_shares_a_proxied_connection(
    monkeypatch: pytest.MonkeyPatch, plain: Server
) -> None:
    forward = proxy()
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{forward.port}")
        monkeypatch.setenv("NO_PROXY", "example.test, .localhost,localhost")
        poster = Poster()
        assert poster.post(plain.url(), BODY, HEADERS, 5.0) is None  # 127.0.0.1: proxied
        assert poster.post(plain.url("localhost"), BODY, HEADERS, 5.0) is None  # straight
        assert poster.post(plain.url(), BODY, HEADERS, 5.0) is None
        assert poster.post(plain.url("localhost"), BODY, HEADERS, 5.0) is None
        assert forward.connections == 1 and plain.connections == 2
        assert [h.decode().split(" ")[1].startswith("http://") for h in plain.heads] == [
            True, False, True, False]  # fmt: skip
        poster.close()
    finally:
        forward.stop()


def test_a_no_proxy_entry_with_a_port_matches_that_port_only(
    monkeypatch: pytest.MonkeyPatch, plain: Server
) -> None:
    forward = proxy()
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{forward.port}")
        other = plain.port + 1 if plain.port < 65535 else plain.port - 1
        monkeypatch.setenv("NO_PROXY", f"127.0.0.1:{other}")
        assert Poster().post(plain.url(), BODY, HEADERS, 5.0) is None  # another port: proxied
        monkeypatch.setenv("NO_PROXY", f"example.test,127.0.0.1:{plain.port}")
        assert Poster().post(plain.url(), BODY, HEADERS, 5.0) is None  # its port: straight
        assert forward.connections == 1 and plain.connections == 2
        assert [h.decode().split(" ")[1].startswith("http://") for h in plain.heads] == [
            True, False]  # fmt: skip
    finally:
        forward.stop()


# (scheme, host as urlsplit's hostname, port connected to, NO_PROXY) -> whether it goes straight
BYPASS = [
    ("http", "hooks.internal", 8080, "hooks.internal:8080", True),
    ("http", "hooks.internal", 8080, "example.test, HOOKS.internal:8080 ", True),
    ("http", "hooks.internal", 8080, "hooks.internal", True),  # no port: every port
    ("http", "hooks.internal", 9090, "hooks.internal", True),
    ("http", "hooks.internal", 8080, "hooks.internal:9090", False),
    ("http", "hooks.internal", 80, "hooks.internal:8080", False),
    ("http", "a.hooks.internal", 8080, ".hooks.internal:8080", True),  # under it, on its port
    ("http", "a.hooks.internal", 8081, ".hooks.internal:8080", False),
    ("http", "xhooks.internal", 8080, "hooks.internal:8080", False),
    ("https", "hooks.internal", 443, "hooks.internal:443", True),  # the scheme's default port
    ("http", "hooks.internal", 80, "hooks.internal:80", True),
    ("https", "hooks.internal", 443, "hooks.internal:80", False),
    ("http", "::1", 8080, "[::1]:8080", True),
    ("http", "::1", 8080, "[::1]:9090", False),
    ("http", "::1", 8080, "::1", True),  # an IPv6 entry without a port: bare or bracketed
    ("http", "::1", 8080, "[::1]", True),
    ("http", "fd00::5", 443, "::5", False),
    ("http", "fd00::1:8080", 80, "fd00::1", False),  # another address, not fd00::1 on 8080
    ("https", "2001:db8::1:443", 443, "example.test, 2001:db8::1", False),
    ("http", "fd00::1:8080", 80, "fd00::1:8080", True),  # (a bare entry is an address, whole)
    ("http", "fd00::1", 80, " FD00::1 ", True),
    ("http", "10.0.0.5", 8080, "10.0.0.5:8080", True),
    ("http", "10.0.0.5", 8080, "10.0.0.5:80", False),
    ("http", "hooks.internal", 8080, "*", True),
    ("http", "hooks.internal", 8080, "example.test,*", False),  # only a lone * is every host
]


@pytest.mark.parametrize(("scheme", "host", "port", "no_proxy", "straight"), BYPASS)
def test_no_proxy_entries_match_the_host_and_a_port_they_name(
    monkeypatch: pytest.MonkeyPatch, scheme: str, host: str, port: int, no_proxy: str,
    straight: bool,
) -> None:  # fmt: skip
    monkeypatch.setenv("ALL_PROXY", "http://proxy.example.test:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    chosen = Proxies().proxy_for(scheme, host, port)
    assert (chosen is None) == straight, chosen


def test_the_choice_is_kept_per_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example.test:3128")
    monkeypatch.setenv("NO_PROXY", "hooks.internal:8080")
    proxies = Proxies()
    for _ in range(2):
        assert proxies.proxy_for("http", "hooks.internal", 8080) is None
        assert proxies.proxy_for("http", "hooks.internal", 9090) is not None


@pytest.mark.parametrize("answer", ["hang", "hang_after"])
def test_a_proxy_that_hangs_is_cut_at_the_posts_deadline(
    monkeypatch: pytest.MonkeyPatch, receiver: Server, trusting: ssl.SSLContext, answer: str
) -> None:
    stuck = proxy(answer)  # says nothing to the CONNECT, or 200 and then nothing (TLS waits)
    try:
        monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{stuck.port}")
        began = time.monotonic()
        reason = Poster(tls=lambda: trusting).post(receiver.url(), BODY, HEADERS, LIMIT)
        took = time.monotonic() - began
    finally:
        stuck.stop()
    assert reason is not None and reason.startswith(f"no complete answer within {LIMIT:g} s")
    assert LIMIT * 0.9 <= took < LIMIT + SLACK
    assert receiver.connections == 0


@pytest.mark.parametrize("answer", ["407", "403"])
def test_a_refused_tunnel_is_a_failure_with_the_proxys_answer(
    monkeypatch: pytest.MonkeyPatch, receiver: Server, trusting: ssl.SSLContext, answer: str
) -> None:
    refusing = proxy(answer)
    try:
        monkeypatch.setenv("HTTPS_PROXY", f"http://me:p%40ss%20word@127.0.0.1:{refusing.port}")
        reason = Poster(tls=lambda: trusting).post(receiver.url(), BODY, HEADERS, 5.0)
    finally:
        refusing.stop()
    told = {"407": "407 Proxy Authentication Required", "403": "403 Forbidden"}[answer]
    assert reason == (f"ProxyError: the proxy 127.0.0.1:{refusing.port} refused the tunnel to "
                      f"127.0.0.1:{receiver.port}: {told}")  # fmt: skip
    assert receiver.connections == 0


def test_a_proxy_that_is_down_is_a_connect_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, plain: Server
) -> None:
    gone = proxy()
    gone.stop()
    monkeypatch.setenv("HTTP_PROXY", f"http://me:secret@127.0.0.1:{gone.port}")
    reason = Poster().post(plain.url(), BODY, HEADERS, 5.0)
    assert reason is not None and reason.startswith(
        f"ConnectError: the proxy 127.0.0.1:{gone.port}: "
    ), reason
    assert "secret" not in reason and plain.connections == 0


@pytest.mark.parametrize(
    ("variable", "value", "scheme"),
    [("HTTPS_PROXY", "https://me:secret@127.0.0.1:1", "https"),
     ("ALL_PROXY", "socks5://127.0.0.1:1", "socks5")],
)  # fmt: skip
def test_a_proxy_reached_over_tls_or_socks_is_refused_clearly(
    monkeypatch: pytest.MonkeyPatch, receiver: Server, variable: str, value: str, scheme: str
) -> None:
    monkeypatch.setenv(variable, value)
    reason = Poster().post(receiver.url(), BODY, HEADERS, 5.0)
    assert reason == (f"ProxyUnsupported: {variable}: a {scheme}:// proxy is not "
                      "supported: only a plain http:// one (TLS to the proxy itself, SOCKS: "
                      "not implemented)")  # fmt: skip
    assert receiver.connections == 0


@pytest.mark.parametrize("value", ["http://alice:qq/ww@127.0.0.1:3128",
                                   "http://alice:4321/x@127.0.0.1:3128",
                                   "http://alice:se?kret@127.0.0.1:3128"])  # fmt: skip
def test_a_proxy_url_that_does_not_parse_never_tells_its_password(
    monkeypatch: pytest.MonkeyPatch, receiver: Server, value: str
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", value)
    poster = Poster()
    reasons = {poster.post(receiver.url(), BODY, HEADERS, 5.0) for _ in range(3)}
    assert len(reasons) == 1
    (reason,) = reasons
    assert reason is not None and reason.startswith(
        "ProxyUnsupported: HTTPS_PROXY: not a proxy URL"
    )
    assert not any(part in reason for part in ("alice", "qq", "ww", "4321", "kret")), reason
    assert receiver.connections == 0


def test_a_refused_proxy_is_a_new_error_each_post(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1")
    proxies = Proxies()
    raised = []
    for _ in range(3):
        with pytest.raises(ProxyUnsupported) as caught:
            proxies.proxy_for("https", "hooks.example.test", 443)
        raised.append(caught.value)
    assert len({id(e) for e in raised}) == 3  # (a kept one would carry every raise's frames)
