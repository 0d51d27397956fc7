"""What systemd's side and the stats probe's store look like in the notify and metrics tests: a
NOTIFY_SOCKET listener, a store gate that answers or fails, and an arbiter that never forks."""

from __future__ import annotations

import socket
import time

from helpers import FakeClock, wait_for

from supervisor.config import StartConfig
from supervisor.loop.arbiter import Arbiter
from supervisor.loop.pool import Pool
from supervisor.loop.signals import SignalInbox
from workerproc import App
from workerproc.config import WorkerConfig
from workerproc.status import StatusBoard
from workerproc.store import Stats, StoreUnavailable
from workerproc.store.calls import CallTotals
from workerproc.store.limits import LimitInfo, LimitSpec
from workerproc.store.webhooks import RetryNumbers, WebhookInfo


class Listener:
    """What systemd does with NOTIFY_SOCKET: receive datagrams; here, keep them with a time."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setblocking(False)
        self.got: list[tuple[float, dict[str, str]]] = []

    def poll(self) -> list[tuple[float, dict[str, str]]]:
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return self.got
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
            self.got.append((time.monotonic(), fields))

    def with_key(self, key: str, since: float = 0.0) -> list[dict[str, str]]:
        return [f for t, f in self.poll() if key in f and t >= since]

    def wait(self, key: str, count: int = 1, since: float = 0.0, timeout: float = 30) -> None:
        wait_for(lambda: len(self.with_key(key, since)) >= count, timeout, what=f"{count}x {key}")

    def close(self) -> None:
        self.sock.close()


class FlakyGate:
    """``StoreGate.session`` answering stats, or failing like a locked database."""

    def __init__(self) -> None:
        self.down = False
        self.calls = CallTotals()  # what the paid calls' metrics read

    def session(self) -> FlakyGate:
        if self.down:
            raise StoreUnavailable("database is locked")
        return self

    def __enter__(self) -> FlakyGate:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def stats(self) -> Stats:
        return Stats(0.0, {"succeeded": 3}, 1, 0, 0, 0, [])

    def fence_rejections(self, after: int = 0, limit: int = 0) -> list[object]:
        return []

    def paid_call_totals(self) -> CallTotals:
        return self.calls

    def limits(self, keys: int = 5) -> list[LimitInfo]:
        spec = LimitSpec.declare("openai", rate="60/s", concurrency=4, tokens="100/s")
        return [LimitInfo("openai", spec, spec.numbers, "h", None, 3, 7, 1200, [], 55.0, 4000.0)]

    def webhooks(self) -> list[WebhookInfo]:
        return [WebhookInfo("billing", "https://x/", None, 1, 0.0, RetryNumbers(), "waiting",
                            40, 37, 2, "event 41: HTTP 503", None, 1, ())]  # fmt: skip


def fake_arbiter(clock: FakeClock, gate: FlakyGate) -> Arbiter:
    def spawner(slot: int, max_tasks: int | None) -> tuple[int, str]:
        raise AssertionError("no fork in this test")

    return Arbiter(
        config=StartConfig(WorkerConfig(db="x.db", app="m:app"), workers=2).validate(),
        app=App(),
        pool=Pool(spawner, clock=clock, target=2),
        inbox=SignalInbox(),
        gate=gate,  # type: ignore[arg-type]
        board=StatusBoard(4),
        clock=clock,
    )
