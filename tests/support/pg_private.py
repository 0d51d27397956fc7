"""A private PostgreSQL cluster, made and destroyed by one test: the partition tests need a server
listening on addresses of their own (a network namespace cannot reach 127.0.0.1 of the host),
and the vacuum tests hold a transaction open that would stop every other user's vacuum on a
shared server. ``initdb`` into a temporary directory as the ``postgres`` user (the server
refuses to run as root), trust auth, started with ``pg_ctl`` on a free port; stopped (``-m
immediate``) and removed on exit, whatever happened."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def pg_bin(name: str) -> str | None:
    """A PostgreSQL server program (initdb, pg_ctl): on PATH, else the newest Debian one."""
    found = shutil.which(name)
    if found:
        return found
    for d in BIN_DIRS:
        if (d / name).exists():
            return str(d / name)
    return None


def missing() -> str | None:
    """Why a private cluster cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "a private PostgreSQL cluster needs root (to run initdb as the postgres user)"
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


class Cluster:
    """One private server: ``url(host)`` for a client that reaches it at ``host``."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port

    def url(self, host: str = "127.0.0.1", database: str = "postgres") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{database}"


def _as_postgres(cmd: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "postgres", "--", *cmd],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@contextlib.contextmanager
def cluster(listen: Sequence[str] = (), settings: Sequence[str] = ()) -> Iterator[Cluster]:
    """A fresh cluster listening on 127.0.0.1 and ``listen`` (addresses that exist already),
    trusting every client of 10.0.0.0/8 too; ``settings``: extra ``name=value`` server
    settings."""
    top = Path(tempfile.mkdtemp(prefix="lk-pg-"))
    os.chmod(top, 0o755)  # the postgres user must reach its data directory
    data = top / "data"
    shutil.chown(top, "postgres", "postgres")
    port = free_port()
    initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
    assert initdb and pg_ctl
    started = False
    try:
        done = _as_postgres([initdb, "-D", str(data), "-A", "trust", "-U", "postgres",
                             "--no-sync", "-E", "UTF8"], timeout=180)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip()[-2000:]}")
        with open(data / "pg_hba.conf", "a") as f:
            f.write("host all all 10.0.0.0/8 trust\n")
        addresses = ",".join(["127.0.0.1", *listen])
        opts = [f"-c listen_addresses='{addresses}'", f"-p {port}",
                f"-c unix_socket_directories='{top}'", "-c fsync=off",
                "-c max_connections=200", *(f"-c {s}" for s in settings)]  # fmt: skip
        done = _as_postgres([pg_ctl, "-D", str(data), "-l", str(top / "server.log"), "-w",
                             "-t", "120", "-o", " ".join(opts), "start"], timeout=180)  # fmt: skip
        started = True
        if done.returncode != 0:
            log = (top / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl start failed: {done.stderr.strip()}\n{log}")
        yield Cluster(top, port)
    finally:
        if started:
            _as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "-t", "60", "stop"],
                         timeout=90)  # fmt: skip
        shutil.rmtree(top, ignore_errors=True)
