"""A private PostgreSQL server for tests that stop and start one (``scripts/soak --restart``):
``initdb`` into a temporary directory, ``pg_ctl`` on a free port of 127.0.0.1, trust auth,
removed at the end. It never touches the machine's shared server (other people's tests run on
it), and needs no cluster of the system's (no ``pg_createcluster``, nothing under /etc).

As root the server runs as the ``postgres`` user (PostgreSQL refuses root), its directory
given to that user. The binaries: the newest /usr/lib/postgresql/*/bin (Debian), else PATH."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def _bin(name: str) -> str:
    def version(path: str) -> int:
        part = path.split("/")[4]
        return int(part) if part.isdigit() else 0

    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=version)
    path = found[-1] if found else shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} is not installed (apt-get install -y postgresql)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.data, self.log = root / "data", root / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses root
            self._as = ["runuser", "-u", "postgres", "--"]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str, timeout: float = 120) -> None:
        done = subprocess.run([*self._as, *argv], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()[-2000:]}")

    def init(self) -> None:
        if self._as:
            runas = pwd.getpwnam("postgres")
            os.chown(self.root, runas.pw_uid, runas.pw_gid)
        self._run(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "-E", "UTF8", "--no-sync")  # fmt: skip

    def start(self, timeout: float = 120) -> None:
        """Start and wait until it accepts connections (``pg_ctl -w``)."""
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c max_connections=200 -c fsync=off")  # fmt: skip
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
                  "-w", "-t", str(int(timeout)), "start", timeout=timeout + 10)  # fmt: skip

    def stop(self, mode: str = "fast", timeout: float = 120) -> None:
        """Stop (``pg_ctl stop -m fast``, as ``pg_ctlcluster stop`` does): the sessions are
        ended, what was committed is kept."""
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t",
                  str(int(timeout)), "stop", timeout=timeout + 10)  # fmt: skip

    def running(self) -> bool:
        done = subprocess.run([*self._as, _bin("pg_ctl"), "-D", str(self.data), "status"],
                              capture_output=True, timeout=30)  # fmt: skip
        return done.returncode == 0


@contextlib.contextmanager
def private_server() -> Iterator[PrivateServer]:
    """A private server, started, until the block ends (then stopped and removed)."""
    root = Path(tempfile.mkdtemp(prefix="lk-pg-"))
    server = PrivateServer(root, _free_port())
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
