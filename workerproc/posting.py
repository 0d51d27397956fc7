"""One webhook POST, bounded (docs/protocol.md B20): a total deadline over connecting,
sending and the whole answer, and at most ``MAX_ANSWER`` bytes of the answer read.

The POST goes through the standard library's ``http.client``, on a keep-alive connection per
receiver that each sender thread keeps (``Poster``: one thread's, never shared) and opens again
when the receiver closed it, or after any failure (its state is then unknown).

A socket timeout bounds one wait for one read; a receiver that answers one byte a second never
trips it. So every blocking call of a POST is given what is left of its deadline, computed
again before each one (``_Deadline``): the connection to each address the name has, the TLS
handshake (the ``ssl`` module bounds a whole handshake by the socket's timeout), the request's
one ``sendall`` (bounded as a whole), and each read of the answer (``_TimedIO``, under
``http.client``'s buffered reads). Past the deadline, the next one fails at once. So no call
outlives the deadline, and a POST cut by it is a failure of its own reason. An answer's body
is read in pieces and given up on past ``MAX_ANSWER`` bytes (the connection is closed, the rest
never read), so an endless answer costs a worker no memory. A redirect is never followed (a
3xx is a failure, as any answer but a 2xx), and an ``https://`` receiver's certificate is
verified against the system's trusted authorities (``ssl.create_default_context``: the host
name checked too; ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name others). Through the proxy the
standard variables name (``workerproc/proxies.py``, read once per ``Poster``): an ``https://``
receiver by a ``CONNECT`` tunnel (its exchange under the same deadline, TLS then checked against
the receiver's name), an ``http://`` one by its absolute URI; the proxy's name is resolved, not
the receiver's; a connection is kept per receiver and proxy (a proxied one and a direct one never
mix).

Resolving the host's name is under the deadline too: ``getaddrinfo`` takes no timeout, so the
POST asks for it in a thread of its own first and waits for it until the deadline at most (a
name that does not resolve in time fails the POST; the thread ends with the resolver's own
timeout). A new connection connects to the addresses that lookup answered (never a lookup of its
own, outside the deadline). A name that resolved is not looked up again for ``RESOLVED_FOR``
seconds: its connection is most likely reused, and a lookup per POST would cost every delivery.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from .proxies import Proxies, Proxy, ProxyUnsupported

MAX_ANSWER = 64 * 1024  # bytes of an answer's body read at most: more is a failure
PIECE = 16 * 1024  # bytes asked for per read of an answer's body
MAX_ERROR = 300  # characters of a failure's reason kept
RESOLVED_FOR = 60.0  # seconds a name that resolved is not looked up again before a POST
KEPT = 4  # receivers a sender thread keeps a connection open to (the least recent closed)
_Key = tuple[str, str, int, Proxy | None]  # a connection's: scheme, host, port, its proxy
_AddrInfo = tuple[Any, ...]  # one of ``socket.getaddrinfo``'s answers
# (host, port) -> its addresses (``socket.getaddrinfo``'s); OSError when the name is unknown
Resolver = Callable[[str, int], list[_AddrInfo]]


def getaddrinfo(host: str, port: int) -> list[_AddrInfo]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


_tls: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The process's client TLS context (made once: loading the trusted authorities costs
    milliseconds): certificates verified, the host name checked."""
    global _tls
    with _tls_lock:
        if _tls is None:
            _tls = ssl.create_default_context()
        return _tls


class ConnectError(OSError):
    """The receiver could not be reached (refused, unreachable): the reason, as it was told."""


class ProxyError(OSError):
    """The proxy would not open a tunnel to the receiver (its answer, as it was told)."""


class _Deadline:
    """The current POST's deadline (monotonic), shared by its connection's calls."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = 0.0

    def left(self) -> float:
        """The seconds left; ``TimeoutError`` when there are none."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the POST's deadline passed")
        return left


class _TimedIO(io.RawIOBase):
    """A connection's reads (under ``http.client``'s buffered reader), each one waiting for
    what is left of the POST's deadline at most."""

    def __init__(self, owner: _Socket) -> None:
        super().__init__()
        self._owner = owner
        self._sock, self._deadline = owner.sock, owner.deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.left())
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._owner.unread()
        super().close()


class _Socket:
    """What ``http.client`` holds as its connection's socket: the real one, whose every send
    and read is bounded by the POST's deadline. Closed once both the connection and the
    answer being read let go of it (``http.client`` closes a connection that will not be
    reused as soon as the answer's head is read: the answer reads on, as with a socket's
    ``makefile``)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock, self.deadline = sock, deadline
        self._readers = 0
        self._closed = False

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(self.deadline.left())  # (a sendall's timeout bounds it all)
        self.sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_TimedIO(self))

    def unread(self) -> None:
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self.sock.close()

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self.sock.close()

    def stale(self) -> bool:
        """Whether the receiver closed it (or sent something unasked) while it was idle: it is
        readable (an end of file, a reset), or TLS has bytes pending."""
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True
        try:  # (poll, not select: a descriptor past 1024 is fine)
            poller = select.poll()
            poller.register(self.sock, select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True


class _Connection(http.client.HTTPConnection):
    """One receiver's keep-alive connection, made (again) by ``connect`` when a request
    needs it, within the POST's deadline; through ``proxy`` when one is given (its own
    connection, never a direct one's: ``Poster`` keys them apart): for TLS a ``CONNECT``
    tunnel (``set_tunnel``), TLS then spoken to the receiver, its name checked."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        deadline: _Deadline,
        addresses: Callable[[str, int], list[_AddrInfo] | None],
        proxy: Proxy | None = None,
    ) -> None:
        super().__init__(*((host, port) if proxy is None else (proxy.host, proxy.port)))
        if tls is not None:
            self.default_port = 443  # (the Host header leaves out the scheme's own port)
            if proxy is not None:  # (bracketed, ASCII: 3.11's CONNECT line adds neither)
                name = f"[{host}]" if ":" in host else ascii_host(host)
                self.set_tunnel(name, port, headers={"Host": f"{name}:{port}", **proxy.headers()})
        self._tls, self._deadline, self._proxy = tls, deadline, proxy
        self._addresses = addresses
        self._receiver, self._receiver_port = host, port
        self._tunnelled = proxy is not None and tls is not None

    def connect(self) -> None:
        try:
            found = self._addresses(self.host, self.port)
            sock = _connect(self.host, self.port, self._deadline, found)
        except ConnectError as exc:
            if self._proxy is None:
                raise
            raise ConnectError(f"the proxy {self._proxy.name}: {exc}") from None
        try:
            if self._tunnelled:  # (its exchange's send and reads: under the deadline too)
                self.sock = _Socket(sock, self._deadline)
                self._tunnel_through()
            if self._tls is not None:
                sock.settimeout(self._deadline.left())  # (a handshake's timeout bounds it all)
                sock = self._tls.wrap_socket(sock, server_hostname=self._receiver)
        except BaseException:
            self.sock = None
            sock.close()
            raise
        self.sock = _Socket(sock, self._deadline)

    def _tunnel_through(self) -> None:
        try:
            self._tunnel()  # type: ignore[attr-defined]  # (http.client's CONNECT exchange)
        except TimeoutError:
            raise
        except OSError as exc:  # "Tunnel connection failed: 407 Proxy Authentication Required"
            told = str(exc).removeprefix("Tunnel connection failed: ")
            assert self._proxy is not None
            raise ProxyError(
                f"the proxy {self._proxy.name} refused the tunnel to "
                f"{self._receiver}:{self._receiver_port}: {told}"
            ) from None

    def stale(self) -> bool:
        return isinstance(self.sock, _Socket) and self.sock.stale()


def _connect(
    host: str, port: int, deadline: _Deadline, found: list[_AddrInfo] | None
) -> socket.socket:
    """A TCP connection to the first of ``found`` (the addresses the POST's lookup answered;
    None: ``host`` is an address, read without a lookup) that answers, each try within what is
    left of the deadline (``TimeoutError`` once it passed)."""
    failure: OSError | None = None
    if found is None:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    for family, kind, proto, _, address in found:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except TimeoutError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            failure = exc
    raise ConnectError(str(failure) if failure else f"no address for {host!r}")


class Poster:
    """The POSTs of one thread: its connections (one per receiver, kept open between POSTs)
    and the deadline of the POST it sends."""

    def __init__(
        self, resolve: Resolver = getaddrinfo, tls: Callable[[], ssl.SSLContext] = tls_context
    ) -> None:
        self._resolve = resolve
        self._tls = tls
        # (host, port) -> until when (monotonic) its addresses are used without a lookup, them
        self._found: dict[tuple[str, int], tuple[float, list[_AddrInfo]]] = {}
        self._deadline = _Deadline()
        self._connections: OrderedDict[_Key, _Connection] = OrderedDict()
        self._proxies = Proxies()  # (the proxy variables: read once, by this sender thread)

    def close(self) -> None:
        """Close every connection kept."""
        while self._connections:
            _, connection = self._connections.popitem()
            with contextlib.suppress(OSError):
                connection.close()

    def post(self, url: str, body: bytes, headers: Mapping[str, str], limit: float) -> str | None:
        """POST ``body`` to ``url`` within ``limit`` seconds in all; None when the receiver
        took it (a 2xx answer, complete, of at most ``MAX_ANSWER`` bytes), else the reason it
        failed."""
        deadline = self._deadline.at = time.monotonic() + limit
        parts = urlsplit(url)
        scheme, host = parts.scheme, parts.hostname or ""
        port = parts.port or _PORTS.get(scheme, 80)
        try:
            proxy = self._proxies.proxy_for(scheme, host, port)
        except ProxyUnsupported as exc:
            return f"ProxyUnsupported: {exc}"[:MAX_ERROR]
        key: _Key = (scheme, host, port, proxy)
        try:
            # through a proxy, the proxy's name is looked up: the receiver's is the proxy's to
            unresolved = self._resolved(*((host, port) if proxy is None else
                                          (proxy.host, proxy.port)), deadline)  # fmt: skip
            if unresolved is not None:
                return unresolved
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            if proxy is not None and scheme != "https":  # (the absolute URI, to the proxy)
                where = f"[{host}]" if ":" in host else ascii_host(host)
                target = f"{scheme}://{where}{'' if parts.port is None else f':{port}'}{target}"
                headers = {**headers, **proxy.headers()}
            failed = self._send(self._connection(key), target, body, headers)
            if failed is not None:
                self._drop(key)  # (an answer not read to its end: the connection is not reused)
            return failed
        except Exception as exc:  # the network's: refused, reset, cut by the deadline ...
            self._drop(key)
            if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
                return f"no complete answer within {limit:g} s ({type(exc).__name__})"
            return f"{type(exc).__name__}: {exc}"[:MAX_ERROR]

    def _connection(self, key: _Key) -> _Connection:
        """The connection kept for ``key`` (closed first if the receiver closed it meanwhile:
        the request opens it again), or a new one."""
        connection = self._connections.get(key)
        if connection is None:
            scheme, host, port, proxy = key
            tls = self._tls() if scheme == "https" else None
            connection = _Connection(host, port, tls, self._deadline, self._addresses, proxy)
            self._connections[key] = connection
            while len(self._connections) > KEPT:
                self._connections.popitem(last=False)[1].close()
        else:
            self._connections.move_to_end(key)
            if connection.stale():
                connection.close()
        return connection

    def _drop(self, key: _Key) -> None:
        connection = self._connections.pop(key, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.close()

    @staticmethod
    def _send(
        connection: _Connection, target: str, body: bytes, headers: Mapping[str, str]
    ) -> str | None:
        connection.request("POST", target, body=body, headers=dict(headers))
        reply = connection.getresponse()
        try:
            status = reply.status
            if not 200 <= status < 300:
                redirect = ": redirects are not followed" if 300 <= status < 400 else ""
                return f"HTTP {status}{redirect}"
            size = 0
            while piece := reply.read(PIECE):
                size += len(piece)
                if size > MAX_ANSWER:
                    return (f"HTTP {status} with an answer longer than {MAX_ANSWER} bytes "
                            "(not read further)")  # fmt: skip
            return None  # (complete: taken, even if the deadline came just after)
        finally:
            reply.close()  # (read to its end: a no-op; else the caller drops the connection)

    def _resolved(self, host: str, port: int, deadline: float) -> str | None:
        """Resolve ``host`` within the POST's deadline, in a thread of its own (the lookup
        cannot be interrupted); None when it resolved (or is an address), else why not."""
        if not host or _is_address(host):
            return None
        if self._found.get((host, port), (0.0, []))[0] > time.monotonic():
            return None  # resolved lately: its connection is most likely reused (no lookup)
        done = threading.Event()
        failure: list[str] = []
        answer: list[list[_AddrInfo]] = []

        def lookup() -> None:
            try:
                answer.append(list(self._resolve(host, port)))
            except Exception as exc:  # (OSError: the resolver's answer; else, told the same)
                failure.append(f"cannot resolve {host!r}: {exc}"[:MAX_ERROR])
            finally:
                done.set()

        threading.Thread(target=lookup, name="leasekeeper-resolve", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            return f"cannot resolve {host!r} within the POST's deadline"
        if failure:
            return failure[0]
        self._found[(host, port)] = (time.monotonic() + RESOLVED_FOR, answer[0])
        return None

    def _addresses(self, host: str, port: int) -> list[_AddrInfo] | None:
        """What the POST's lookup answered for ``host`` (None: an address, no lookup)."""
        if not host or _is_address(host):
            return None
        return self._found.get((host, port), (0.0, []))[1]


_PORTS = {"http": 80, "https": 443}


def ascii_host(host: str) -> str:
    """``host`` as a request line carries it: an international name in its IDNA form."""
    return host if host.isascii() else host.encode("idna").decode("ascii")


def _is_address(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host.partition("%")[0])
    except OSError:
        return False
    return True
