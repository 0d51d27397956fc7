"""Listening TCP sockets for the supervisor's endpoints (the metrics of the main loop, the
dashboard's server): close-on-exec, address reuse, one clear error each way it can fail."""

from __future__ import annotations

import errno
import socket

from .errors import ConfigError, SupervisorError


def listen_tcp(
    host: str, port: int, *, option: str, backlog: int, nonblocking: bool = False
) -> socket.socket:
    """A listening socket on ``host:port``. A host that does not resolve is the user's option
    (``option`` names it: ConfigError, exit 2); a port that cannot be bound is SupervisorError."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"{option} {host!r}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    kind = socket.SOCK_STREAM | socket.SOCK_CLOEXEC | (socket.SOCK_NONBLOCK if nonblocking else 0)
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        raise SupervisorError(f"cannot listen on {host}:{port}: {why}") from None
    return sock
