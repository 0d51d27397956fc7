"""scripts/bench's process plumbing: our pool draining a database, huey's consumer and the
datagram inbox its tasks report to, stopping processes, sampling their memory."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs another checkout's code (its packages and scripts first)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "scripts")])}


class Inbox:
    """A Unix datagram socket the huey tasks report to."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(path)
        self.count = 0
        self.messages: list[tuple[float, bytes]] = []
        self.keep = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            data = self.sock.recv(256)
            self.count += 1
            if self.keep:
                self.messages.append((time.time(), data))

    def wait(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count < count and time.monotonic() < deadline:
            time.sleep(0.002)
        return self.count >= count


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sample_rss(pid: int, peak: dict[str, float]) -> None:
    """Raise ``peak``'s "supervisor" and "worker" (MB) to what the process ``pid`` and the
    largest of its children use now."""
    try:
        parent = psutil.Process(pid)
        peak["supervisor"] = max(peak.get("supervisor", 0), parent.memory_info().rss / 2**20)
        for child in parent.children():
            peak["worker"] = max(peak.get("worker", 0), child.memory_info().rss / 2**20)
    except psutil.Error:
        pass


# -- ours ----------------------------------------------------------------------------------------
def drain(
    db: str,
    m: int,
    url: str,
    options: Sequence[str],
    rss: dict[str, float] | None = None,
    tree: Path | None = None,
) -> float:
    """Seconds from starting ``supervisor start OPTIONS --drain`` on ``url`` until the last of
    the ``m`` runs in ``db`` finished (their ``finished_at``: like huey's last datagram, this
    leaves out the drain check and the shutdown after it). Every run must have succeeded.
    ``tree``: the checkout whose code runs (scripts/bench before; this one by default)."""
    cmd = [PY, "-m", "supervisor", "start", *options, "--db", url, "--app", "benchapp:app",
           "--drain"]  # fmt: skip
    cwd, env = HERE, ENV
    if tree is not None:
        cwd, env = tree / "scripts", tree_env(tree)
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        if rss is not None:
            sample_rss(proc.pid, rss)
        time.sleep(0.05)
    if proc.poll() is None:
        stop(proc)
        raise SystemExit(f"ours {' '.join(options)}: still draining after 900 s")
    conn = sqlite3.connect(db)
    done, last = conn.execute(
        "SELECT count(*), max(finished_at) FROM runs WHERE status = 'succeeded'"
    ).fetchone()
    conn.close()
    if proc.returncode != 0 or done != m:
        shown = " ".join(options)
        raise SystemExit(f"ours {shown}: exit {proc.returncode}, {done} of {m} runs succeeded")
    return float(last) - started


# -- huey ----------------------------------------------------------------------------------------
def huey_env(tmp: str, tag: str) -> tuple[dict[str, str], Inbox]:
    db = os.path.join(tmp, f"huey-{tag}-{time.monotonic_ns()}.db")
    # the socket in a short directory of its own: a Unix socket's path is at most 107 bytes,
    # and ``tmp`` may be long (pytest's, or a --dir)
    sockets = tempfile.mkdtemp(prefix="lk-huey-")
    atexit.register(shutil.rmtree, sockets, True)
    inbox = Inbox(os.path.join(sockets, f"{time.monotonic_ns()}.sock"))
    return {**ENV, "LK_HUEY_DB": db, "LK_HUEY_SOCK": inbox.path}, inbox


def huey_enqueue(env: dict[str, str], task: str, n: int, *args: float) -> None:
    code = (
        "import sys; import bench_huey as b\n"
        "b.huey.storage.conn.execute('pragma synchronous=0')  # a fast set-up only\n"
        f"t = getattr(b, {task!r})\n"
        f"for _ in range({n}): t(*{list(args)!r})\n"
    )
    subprocess.run([PY, "-c", code], cwd=HERE, env=env, check=True)


def huey_consumer(env: dict[str, str], w: int, kind: str = "process") -> subprocess.Popen[bytes]:
    """``huey_consumer -k KIND -w W``: process workers, or thread workers."""
    cmd = [str(Path(PY).with_name("huey_consumer")), "bench_huey.huey", "-k", kind,
           "-w", str(w), "-n", "-C"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=HERE, env=env, stderr=subprocess.DEVNULL)


def huey_drain(env: dict[str, str], inbox: Inbox, m: int, w: int, kind: str = "process") -> float:
    """Seconds from starting the consumer until ``m`` tasks reported done."""
    started = time.monotonic()
    proc = huey_consumer(env, w, kind)
    finished = inbox.wait(m, timeout=600)
    elapsed = time.monotonic() - started
    stop(proc)
    if not finished:
        raise SystemExit(f"huey -k {kind} -w {w}: only {inbox.count} of {m} tasks reported done")
    return elapsed
