"""A private PostgreSQL server, made and destroyed by one test or soak: ``initdb`` into a
temporary directory, ``pg_ctl`` on a free port, trust auth, removed at the end whatever
happened. It never touches the machine's shared server, where other tests run: a restart soak
stops it (``scripts/soak --restart``), the partition tests need it listening on addresses of
their own (a network namespace cannot reach the host's 127.0.0.1), and the vacuum tests hold a
transaction open that would stop every other user's vacuum. It needs no cluster of the
system's (no ``pg_createcluster``, nothing under /etc).

As root the server runs as the ``postgres`` user (PostgreSQL refuses root), its directory
given to that user. The binaries: on PATH, else the newest /usr/lib/postgresql/*/bin (Debian)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                  key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0,
                  reverse=True)  # fmt: skip


def pg_bin(name: str) -> str | None:
    """A PostgreSQL server program (initdb, pg_ctl): on PATH, else the newest Debian one."""
    found = shutil.which(name)
    if found:
        return found
    for d in BIN_DIRS:
        if (d / name).exists():
            return str(d / name)
    return None


def _bin(name: str) -> str:
    path = pg_bin(name)
    if path is None:
        raise FileNotFoundError(f"{name} is not installed (apt-get install -y postgresql)")
    return path


def missing() -> str | None:
    """Why a private server cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "a private PostgreSQL server needs root (to run initdb as the postgres user)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user"
    for tool in ("initdb", "pg_ctl"):
        if pg_bin(tool) is None:
            return f"{tool} is not installed (apt-get install -y postgresql)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """One private server, listening on 127.0.0.1 and ``listen`` (addresses that exist
    already), trusting every client of 10.0.0.0/8 too; ``settings``: extra ``name=value``
    server settings. ``url(host)`` for a client that reaches it at ``host``."""

    def __init__(
        self, root: Path, port: int, listen: Sequence[str] = (), settings: Sequence[str] = ()
    ) -> None:
        self.root, self.port = root, port
        self.data, self.log = root / "data", root / "server.log"
        self.listen, self.settings = tuple(listen), tuple(settings)
        self._as: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses root
            self._as = ["runuser", "-u", "postgres", "--"]

    def url(self, host: str = "127.0.0.1", database: str = "postgres") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{database}"

    def _run(self, *argv: str, timeout: float = 180) -> None:
        done = subprocess.run([*self._as, *argv], capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()[-2000:]}"
                               f"\n{log}")  # fmt: skip

    def init(self) -> None:
        if self._as:
            os.chmod(self.root, 0o755)  # the postgres user must reach its data directory
            runas = pwd.getpwnam("postgres")
            os.chown(self.root, runas.pw_uid, runas.pw_gid)
        self._run(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "-E", "UTF8", "--no-sync")  # fmt: skip
        with open(self.data / "pg_hba.conf", "a") as f:
            f.write("host all all 10.0.0.0/8 trust\n")

    def start(self, timeout: float = 120) -> None:
        """Start and wait until it accepts connections (``pg_ctl -w``)."""
        addresses = ",".join(["127.0.0.1", *self.listen])
        options = [f"-c listen_addresses='{addresses}'", f"-p {self.port}",
                   f"-c unix_socket_directories='{self.root}'", "-c fsync=off",
                   "-c max_connections=200", *(f"-c {s}" for s in self.settings)]  # fmt: skip
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o",
                  " ".join(options), "-w", "-t", str(int(timeout)), "start",
                  timeout=timeout + 10)  # fmt: skip

    def stop(self, mode: str = "fast", timeout: float = 120) -> None:
        """Stop (``pg_ctl stop -m fast``, as ``pg_ctlcluster stop`` does): the sessions are
        ended, what was committed is kept."""
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t",
                  str(int(timeout)), "stop", timeout=timeout + 10)  # fmt: skip

    def running(self) -> bool:
        done = subprocess.run([*self._as, _bin("pg_ctl"), "-D", str(self.data), "status"],
                              capture_output=True, timeout=30, check=False)  # fmt: skip
        return done.returncode == 0


@contextlib.contextmanager
def private_server(
    listen: Sequence[str] = (), settings: Sequence[str] = ()
) -> Iterator[PrivateServer]:
    """A private server, started, until the block ends (then stopped and removed)."""
    root = Path(tempfile.mkdtemp(prefix="lk-pg-"))
    server = PrivateServer(root, free_port(), listen, settings)
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            if server.running():
                server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


def wait_accepting(url: str, timeout: float = 60) -> float:
    """Wait until ``url`` answers a query; the monotonic time it first did."""
    import psycopg  # noqa: PLC0415 - only here

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return time.monotonic()
        except psycopg.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
