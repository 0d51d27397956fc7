"""A private PgBouncer in transaction mode in front of the tests' PostgreSQL server: a temporary
config and auth file, a free port, ``pool_mode = transaction``, started and stopped by the test
(or the script) that needs it. Debian's ``pgbouncer`` (/usr/sbin/pgbouncer); without it the
tests skip loudly, or fail under LEASEKEEPER_REQUIRE_TOOLS (.ci/run installs it).

PgBouncer refuses to run as root: as root it is started with ``-u postgres`` (its files then
belong to that user)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BINARY = "/usr/sbin/pgbouncer"


def binary() -> str | None:
    """The pgbouncer binary, or None when it is not installed."""
    return BINARY if os.access(BINARY, os.X_OK) else shutil.which("pgbouncer")


def version() -> str:
    found = binary()
    assert found is not None
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10)
    return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Bouncer:
    port: int
    server_host: str
    server_port: int
    log: str

    def url(self, direct_url: str, listen: str = "direct") -> str:
        """``direct_url`` (a URL on the server) through this pooler: its port and our
        ``pooler=transaction`` option, wake-ups by LISTEN straight to the server
        (``listen=direct``) or by polling (``poll``)."""
        parts = urlsplit(direct_url)
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        glue = "&" if parts.query else ""
        query = f"{parts.query}{glue}pooler=transaction&listen={listen}"
        if listen == "direct":
            query += f"&listen_host={self.server_host}&listen_port={self.server_port}"
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}", query=query))


@contextlib.contextmanager
def running(server_url: str, *, pool_size: int = 20, timeout: float = 30.0) -> Iterator[Bouncer]:
    """A PgBouncer in transaction mode for the server of ``server_url`` (trust auth), until
    the block ends; every database of that server under its own name."""
    found = binary()
    if found is None:
        raise FileNotFoundError("pgbouncer is not installed (apt-get install -y pgbouncer)")
    server = urlsplit(server_url)
    host, server_port = server.hostname or "127.0.0.1", server.port or 5432
    user = server.username or "postgres"
    with tempfile.TemporaryDirectory(prefix="lk-pgbouncer-") as tmp:
        port = free_port()
        ini, users = os.path.join(tmp, "pgbouncer.ini"), os.path.join(tmp, "users.txt")
        log, pid = os.path.join(tmp, "pgbouncer.log"), os.path.join(tmp, "pgbouncer.pid")
        with open(users, "w", encoding="utf-8") as f:
            f.write(f'"{user}" ""\n')
        with open(ini, "w", encoding="utf-8") as f:
            f.write(
                "[databases]\n"
                f"* = host={host} port={server_port}\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
                f"auth_type = trust\nauth_file = {users}\n"
                "pool_mode = transaction\n"
                f"max_client_conn = 1000\ndefault_pool_size = {pool_size}\n"
                "server_reset_query =\n"
                f"admin_users = {user}\nstats_users = {user}\n"
                "log_connections = 0\nlog_disconnections = 0\n"
                f"logfile = {log}\npidfile = {pid}\n"
            )
        command = [found, ini]
        if os.geteuid() == 0:  # it refuses root: its own user, who must own its files
            runas = pwd.getpwnam("postgres")
            for path in (tmp, ini, users):
                os.chown(path, runas.pw_uid, runas.pw_gid)
            command = [found, "-u", "postgres", ini]
        # its output to the log file only: a pipe nobody reads fills, and then it stops
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    said = Path(log).read_text("utf-8") if os.path.exists(log) else ""
                    raise RuntimeError(f"pgbouncer exited {proc.returncode}: {said[-2000:]}")
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not listen on {port} in {timeout} s")
                time.sleep(0.05)
            yield Bouncer(port, host, server_port, log)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # its immediate shutdown
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
