"""The Prometheus endpoint: the text format, the loop-driven HTTP server with real sockets, and
a real supervisor scraped over HTTP while tasks complete, a zombie write is refused and a worker
is killed."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import FakeClock, wait_for
from notify_fakes import FlakyGate, fake_arbiter
from prometheus_client.parser import text_string_to_metric_families
from sv_harness import Supervisor

from supervisor.errors import SupervisorError
from supervisor.integrations import http as metrics_http
from supervisor.integrations.http import HttpEndpoint, listen
from supervisor.integrations.metrics import Metrics, cumulative
from supervisor.integrations.probe import StatsProbe
from supervisor.integrations.tally import exit_reason
from supervisor.loop.pool import Exit, ExitKind, WorkerProcess
from workerproc import exitcodes as wexit
from workerproc.store import TaskOptions, open_store
from workerproc.store.limits import LimitSpec

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text format -> {(name, labels): value}; fails on any malformed line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) \w+ ", line) or not line, line
            continue
        m = SAMPLE.match(line)
        assert m, f"malformed sample line: {line!r}"
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# -- the text format ---------------------------------------------------------------------------
METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "metrics.md"


def documented_series() -> dict[str, str]:
    """The docs site's Metrics table: series name -> type."""
    text = METRICS_PAGE.read_text()
    table = text[text.index("| series | type | meaning |") :].split("\n\n", 1)[0]
    out = {}
    for row in table.splitlines()[2:]:
        series, kinds = row.split(" | ")[0:2]
        names = re.findall(r"`(leasekeeper_\w+)", series)
        types = [t.strip() for t in kinds.split(",")]
        if len(types) == 1:
            types *= len(names)  # one type for every series of the row
        out.update(zip(names, types, strict=True))
    return out


def test_cumulative_buckets_end_with_inf() -> None:
    assert cumulative([0.1, 1.0], [1, 2, 1]) == [("0.1", 1), ("1.0", 3), ("+Inf", 4)]


def test_exposition_has_exactly_the_documented_series_and_nothing_else(clock: FakeClock) -> None:
    """prometheus-client renders the families; the names and types are the docs', with no
    default collector (process, platform, GC) and no thread started."""
    threads = threading.active_count()
    arb = fake_arbiter(clock, FlakyGate())
    metrics = Metrics(StatsProbe())
    metrics.install(arb)
    text = metrics.render(arb)
    rendered = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    assert rendered == documented_series()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the library parses it
    assert families["leasekeeper_task_duration_seconds"].type == "histogram"
    assert "_created" not in text  # the start time is its own series
    assert threading.active_count() == threads


@pytest.mark.parametrize(
    ("code", "sig", "kind", "retiring", "expected_death", "reason"),
    [
        (None, signal.SIGKILL, ExitKind.CRASHED, None, False, "SIGKILL"),
        (wexit.TASK_TIMEOUT, None, ExitKind.CRASHED, None, False, "task_timeout"),
        (
            wexit.LEASE_STUCK,
            None,
            ExitKind.CRASHED,
            None,
            False,
            "lease_lost_and_handler_did_not_stop",
        ),
        (wexit.RECYCLE, None, ExitKind.RECYCLED, None, False, "recycled_after_max_tasks"),
        (0, None, ExitKind.RETIRED, "scale down", False, "scale_down"),
        (None, signal.SIGKILL, ExitKind.RETIRED, None, True, "chaos"),
    ],
)
def test_exit_reason(
    code: int | None,
    sig: int | None,
    kind: ExitKind,
    retiring: str | None,
    expected_death: bool,
    reason: str,
) -> None:
    worker = WorkerProcess(1, 0, "o", 0, 0.0, retiring=retiring, expected_death=expected_death)
    assert exit_reason(Exit(worker, code, sig, 1.0, kind)) == reason


def test_render_counts_bus_events(clock: FakeClock) -> None:
    arb = fake_arbiter(clock, FlakyGate())
    metrics = Metrics(StatsProbe())
    metrics.install(arb)
    worker = WorkerProcess(7, 0, "o", 0, 0.0)
    arb.events.emit("worker_started", worker=worker)
    arb.events.emit("worker_exited", exit=Exit(worker, None, signal.SIGKILL, 1.0, ExitKind.CRASHED))
    arb.events.emit("chaos_fault", fault="pause", pid=7, task_id=3, phase="handler")
    arb.events.emit("leases_released", owner="o", count=2)
    samples = parse(metrics.render(arb))
    assert value(samples, "leasekeeper_runs", queue="default", status="succeeded") == 3
    assert value(samples, "leasekeeper_tasks", queue="default", state="ready") == 1
    assert value(samples, "leasekeeper_worker_starts_total") == 1
    assert value(samples, "leasekeeper_worker_exits_total", kind="crashed", reason="SIGKILL") == 1
    assert value(samples, "leasekeeper_chaos_faults_total", fault="pause") == 1
    assert value(samples, "leasekeeper_chaos_faults_total", fault="kill") == 0
    assert value(samples, "leasekeeper_leases_released_total") == 2
    assert value(samples, "leasekeeper_store_up") == 1


# -- the HTTP endpoint, driven like the loop drives it ----------------------------------------
@pytest.fixture
def endpoint() -> Iterator[HttpEndpoint]:
    ep = HttpEndpoint(
        listen("127.0.0.1", 0),
        {"/metrics": lambda: ("text/plain", "up 1\n")},
        wake_fds=set(),
    )
    yield ep
    ep.close()


def exchange(ep: HttpEndpoint, *chunks: bytes) -> bytes:
    """Send ``chunks`` one serve() apart (a client that trickles); return the whole response."""
    client = socket.create_connection(ep.address, timeout=5)
    with client:
        for chunk in chunks:
            client.sendall(chunk)
            ep.serve()
        client.setblocking(False)
        data = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            ep.serve()
            try:
                part = client.recv(65536)
            except BlockingIOError:
                time.sleep(0.005)
                continue
            if not part:
                return data
            data += part
    raise AssertionError(f"no complete response; got {data!r}")


def test_get_metrics_in_pieces(endpoint: HttpEndpoint) -> None:
    response = exchange(endpoint, b"GET /metr", b"ics HTTP/1.1\r\nHost: x\r\n", b"\r\n")
    head, body = response.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 5" in head
    assert body == b"up 1\n"
    assert not endpoint.conns  # closed after the answer
    assert endpoint.wake_fds == {endpoint.sock.fileno()}


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (b"GET /nope HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
        (b"garbage\r\n\r\n", b"400"),
        (b"GET /" + b"x" * (metrics_http.MAX_REQUEST + 10), b"431"),
    ],
)
def test_bad_requests(endpoint: HttpEndpoint, request_: bytes, status: bytes) -> None:
    assert exchange(endpoint, request_).split(b" ")[1] == status


def test_head_has_no_body(endpoint: HttpEndpoint) -> None:
    response = exchange(endpoint, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert response.endswith(b"\r\n\r\n") and b"Content-Length: 5" in response


def test_silent_clients_are_dropped_and_connections_bounded() -> None:
    clock = FakeClock()
    wake: set[int] = set()
    ep = HttpEndpoint(listen("127.0.0.1", 0), {}, wake, clock=clock)
    clients: list[socket.socket] = []
    try:
        for _ in range(metrics_http.MAX_CONNECTIONS + 3):  # connect, say nothing
            clients.append(socket.create_connection(ep.address, timeout=5))
            ep.serve()
        assert len(ep.conns) == metrics_http.MAX_CONNECTIONS  # the extra ones were turned away
        assert len(wake) == metrics_http.MAX_CONNECTIONS + 1  # every reading client + listener
        clock.advance(metrics_http.TIMEOUT + 1)
        ep.serve()
        assert not ep.conns and wake == {ep.sock.fileno()}
    finally:
        for c in clients:
            c.close()
        ep.close()
    assert wake == set()


def test_a_port_in_use_is_a_clear_error(endpoint: HttpEndpoint) -> None:
    with pytest.raises(
        SupervisorError, match=r"cannot listen on 127\.0\.0\.1:\d+: the port is in use"
    ):
        listen("127.0.0.1", endpoint.address[1])


# -- the real supervisor -------------------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(resp.read().decode())


@pytest.mark.slow
def test_scraped_counters_move_with_tasks_zombies_and_kills(sv_each: Supervisor) -> None:
    sv = sv_each  # on SQLite and on PostgreSQL
    # A zombie to be: a lease taken by an owner that then goes silent past its short ttl.
    store = open_store(sv.db)
    try:
        zombie_run = store.start_run("noop")
        zombie = store.claim("otherhost:1:1.0:zombie", ttl=0.3)
        assert zombie is not None and zombie.run_id == zombie_run
    finally:
        store.close()
    sv.start("--metrics-port", "0", n=2)
    (listening,) = sv.wait_event("metrics_listening")
    port = int(listening["port"])
    assert listening["host"] == "127.0.0.1"
    sv.wait_event("ready")

    first = scrape(port)
    assert value(first, "leasekeeper_workers_target") == 2
    assert value(first, "leasekeeper_worker_starts_total") == 2
    assert value(first, "leasekeeper_store_up") == 1
    assert value(first, "leasekeeper_zombie_writes_rejected_total") == 0

    runs = [sv.enqueue("chain", {"left": 2}) for _ in range(5)]
    done = wait_for(
        lambda: (
            s
            if value(s := scrape(port), "leasekeeper_runs", queue="default", status="succeeded")
            == 6
            else None
        ),
        what="6 runs succeeded in /metrics",
    )  # the 5 chains and the zombie's run, taken over once its lease expired
    assert value(done, "leasekeeper_tasks", queue="default", state="leased") == 0
    assert all(sv.run_status(r) == "succeeded" for r in runs)
    # counted by the workers: 5 chains of 3 tasks, and the zombie's task taken over
    assert value(done, "leasekeeper_claims_total") >= 16
    assert value(done, "leasekeeper_takeovers_total") == 1
    assert value(done, "leasekeeper_task_duration_seconds_count") >= 16
    assert value(done, "leasekeeper_task_duration_seconds_bucket", le="+Inf") >= 16

    store = open_store(sv.db)
    try:
        assert store.ack(zombie) is False  # the zombie wakes up and tries to write
    finally:
        store.close()
    fenced = wait_for(
        lambda: s if value(s := scrape(port), "leasekeeper_zombie_writes_rejected_total") else None,
        what="the refused write in /metrics",
    )
    assert value(fenced, "leasekeeper_fence_rejections_total", op="ack") == 1
    assert value(fenced, "leasekeeper_lease_losses_total") == 1

    workers = sv.workers()
    for pid in workers:  # no metrics socket (listening or accepted) leaked into a worker
        conns = psutil.Process(pid).net_connections(kind="inet")
        assert [c for c in conns if port in (c.laddr.port, c.raddr and c.raddr.port)] == []
    psutil.Process(workers[0]).kill()
    killed = wait_for(
        lambda: (
            s
            if value(
                s := scrape(port),
                "leasekeeper_worker_exits_total",
                kind="crashed",
                reason="SIGKILL",
            )
            else None
        ),
        what="the killed worker in /metrics",
    )
    # a reaped worker's counts are banked, not lost with it
    assert value(killed, "leasekeeper_claims_total") >= value(done, "leasekeeper_claims_total")
    assert value(killed, "leasekeeper_task_duration_seconds_count") >= 16
    wait_for(  # replaced (after the crash-loop backoff: it died young)
        lambda: value(scrape(port), "leasekeeper_worker_starts_total") == 3,
        what="a replacement worker in /metrics",
    )
    assert value(killed, "leasekeeper_workers_target") == 2
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
    sv.signal(signal.SIGTERM)
    assert sv.wait_exit() == 0


def test_batch_sizes_are_in_the_exposition(clock: FakeClock) -> None:
    """Batch steps' calls and the items they took (items per call is their ratio): a reaped
    worker's banked totals plus a live one's."""
    arb = fake_arbiter(clock, FlakyGate())
    metrics = Metrics(StatsProbe())
    metrics.install(arb)
    for items in (64, 64, 22):
        metrics.tally.banked.batch_done(items)
    samples = parse(metrics.render(arb))
    assert value(samples, "leasekeeper_batch_calls_total") == 3
    assert value(samples, "leasekeeper_batch_items_total") == 150


def test_limits_are_in_the_exposition(clock: FakeClock) -> None:
    """Flow control's gauges, from the probe's read of ``store.limits()``."""
    arb = fake_arbiter(clock, FlakyGate())
    metrics = Metrics(StatsProbe())
    metrics.install(arb)
    samples = parse(metrics.render(arb))
    assert value(samples, "leasekeeper_limit_in_use", limit="openai") == 3
    assert value(samples, "leasekeeper_limit_waiting", limit="openai") == 7
    assert value(samples, "leasekeeper_limit_capacity", limit="openai", number="concurrency") == 4
    assert value(samples, "leasekeeper_limit_capacity", limit="openai", number="rate") == 60
    assert value(samples, "leasekeeper_limit_tokens", limit="openai", state="used") == 1200
    assert value(samples, "leasekeeper_limit_tokens", limit="openai", state="left") == 4000
    assert value(samples, "leasekeeper_limit_rate_level", limit="openai") == 55


def test_webhooks_are_in_the_exposition(clock: FakeClock) -> None:
    """Webhook delivery's families (B20), from the probe's read of ``store.webhooks()``."""
    arb = fake_arbiter(clock, FlakyGate())
    metrics = Metrics(StatsProbe())
    metrics.install(arb)
    samples = parse(metrics.render(arb))
    assert value(samples, "leasekeeper_webhook_deliveries_total", webhook="billing") == 37
    assert value(samples, "leasekeeper_webhook_dead_letters_total", webhook="billing") == 1
    assert value(samples, "leasekeeper_webhook_failing", webhook="billing") == 2
    assert value(samples, "leasekeeper_webhook_cursor", webhook="billing") == 40


def test_a_real_stores_limits_reach_the_probe(tmp_path: Path, clock: FakeClock) -> None:
    db = str(tmp_path / "lk.db")
    with open_store(db) as s:
        s.register_tasks({"call": TaskOptions(limits=("cap",))})
        s.declare_limits({"cap": LimitSpec.declare("cap", concurrency=1)}, by="h")
        s.start_runs([{"task": "call"}] * 3)
        assert len(s.claim("w", 30.0, limit=3)) == 1

    class Gate:
        def session(self) -> object:
            return open_store(db)

    arb = fake_arbiter(clock, FlakyGate())
    arb.gate = Gate()  # type: ignore[assignment]
    probe = StatsProbe()
    assert probe.read(arb)
    (info,) = probe.limits
    assert (info.name, info.in_use, info.waiting) == ("cap", 1, 2)
