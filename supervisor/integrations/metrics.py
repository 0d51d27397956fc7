"""Prometheus metrics: what the supervisor knows, rendered by prometheus-client.

The text format is prometheus-client's (``generate_latest``), from a private
``CollectorRegistry`` that holds one custom collector and nothing else: no default process,
platform or GC collectors, no multiprocess directory, no HTTP server and no thread (the
supervisor forks, and forks only from a single thread). The collector builds every family fresh
on each scrape from three sources:

- the database, through the shared ``StatsProbe`` (one short session per read, re-read only when
  a scrape finds the cache older than ``max_age``): runs by status, tasks by state, and the
  writes the fence refused (zombie writes rejected, by operation; lease losses);
- the arbiter: target, generation, workers by phase;
- the ``Tally`` of bus events and worker status slots (``tally``).

Database-wide numbers (runs, tasks, refused writes) are the same for every supervisor sharing
one database: aggregate them across hosts with ``max``, never ``sum``. Refused writes are read
incrementally from ``fence_rejections`` and counted from the start of the table, so those
counters survive supervisor restarts. Claims, takeovers and task durations cover this
supervisor's workers since it started (sum them across hosts). Counters carry no ``_created``
sample: the start time is its own series, ``leasekeeper_supervisor_start_time_seconds``.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from workerproc.status import DURATION_BOUNDS, PHASE_NAMES
from workerproc.store.types import RUN_STATUSES, QueueCounts

from ..loop.arbiter import Arbiter
from .probe import StatsProbe
from .tally import Tally

PREFIX = "leasekeeper_"
# What generate_latest writes: the Prometheus text format 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TASK_STATES = ("ready", "delayed", "leased", "expired")


def cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last one past every bound) as cumulative ``(le, count)`` pairs,
    ``le`` ending with +Inf, as a histogram family wants them."""
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        running += count
        out.append(("+Inf" if math.isinf(bound) else repr(float(bound)), running))
    return out


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def labelled(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    doc: str,
    labels: Sequence[str],
    samples: Iterable[tuple[Sequence[str], float]],
) -> Metric:
    family = kind(PREFIX + name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


class SupervisorCollector:
    """A prometheus-client collector: every family, built from current state on each scrape."""

    def __init__(self, probe: StatsProbe, tally: Tally, arb: Arbiter) -> None:
        self.probe = probe
        self.tally = tally
        self.arb = arb

    def collect(self) -> Iterator[Metric]:
        yield from self._store()
        yield from self._limits()
        yield from self._webhooks()
        yield from self._fencing()
        yield from self._work()
        yield from self._calls()
        yield from self._workers()
        yield from self._supervisor()

    def _store(self) -> Iterator[Metric]:
        stats = self.probe.stats
        if stats is not None:
            queues = stats.queues or {  # a database with no run yet: one empty default queue
                "default": QueueCounts(
                    stats.ready, stats.delayed, stats.leased, stats.expired, dict(stats.runs)
                )
            }
            runs = [
                ([queue, s], n)
                for queue, c in sorted(queues.items())
                for s, n in sorted(({s: 0 for s in RUN_STATUSES} | c.runs).items())
            ]
            yield labelled(
                GaugeMetricFamily,
                "runs",
                "Runs in the database by queue and status.",
                ["queue", "status"],
                runs,
            )
            tasks = [
                ([queue, s], n)
                for queue, c in sorted(queues.items())
                for s, n in zip(TASK_STATES, (c.ready, c.delayed, c.leased, c.expired), strict=True)
            ]
            yield labelled(
                GaugeMetricFamily,
                "tasks",
                "Pending tasks by queue: ready to claim, delayed, under a live lease, lease "
                "expired.",
                ["queue", "state"],
                tasks,
            )

    def _calls(self) -> Iterator[Metric]:
        calls = self.probe.calls
        if calls is None:
            return
        yield labelled(
            CounterMetricFamily,
            "calls",
            "Paid calls (ctx.once) by outcome: started (an intent recorded before each call), "
            "kept (answers kept), reused (an attempt took the kept answer instead of paying), "
            "paid_again (an intent after an earlier one of the same call: an upper bound of "
            "real second payments), unknown (an intent whose attempt ended without an answer). "
            "Counted from the database: pruned runs leave the count.",
            ["outcome"],
            [(["started"], calls.started), (["kept"], calls.kept), (["reused"], calls.reused),
             (["paid_again"], calls.paid_again), (["unknown"], calls.unknown)],
        )  # fmt: skip
        yield labelled(
            CounterMetricFamily,
            "paid_calls",
            "Paid calls kept by ctx.once, by outcome: paid (kept), reused (an attempt took the "
            "kept answer instead of paying), paid_unused (paid again and thrown away: the loser "
            "of a race). Counted from the kept calls: pruned runs leave the count.",
            ["outcome"],
            [(["paid"], calls.calls), (["reused"], calls.reused),
             (["paid_unused"], calls.unused)],
        )  # fmt: skip
        yield labelled(
            CounterMetricFamily,
            "paid_call_tokens",
            "Tokens of paid calls kept by ctx.once, by outcome: paid, saved (by reuse), "
            "paid_unused.",
            ["outcome"],
            [(["paid"], calls.tokens), (["saved"], calls.saved_tokens),
             (["paid_unused"], calls.unused_tokens)],
        )  # fmt: skip

    def _limits(self) -> Iterator[Metric]:
        """Flow control, as every host sees it: the same on each supervisor of one
        database (aggregate with ``max``)."""
        infos = self.probe.limits
        yield labelled(
            GaugeMetricFamily,
            "limit_in_use",
            "Live leases holding a slot of each limit (all its keys).",
            ["limit"],
            [([i.name], i.in_use) for i in infos],
        )
        yield labelled(
            GaugeMetricFamily,
            "limit_capacity",
            "Each limit's numbers now: concurrency (slots per key), rate and tokens (per "
            "second), burst and token_burst (bucket sizes).",
            ["limit", "number"],
            [([i.name, k], v) for i in infos for k, v in sorted(i.spec.numbers.items())],
        )
        yield labelled(
            GaugeMetricFamily,
            "limit_waiting",
            "Runs waiting behind each limit (in a line, not leased; a run of several limits "
            "counts under each).",
            ["limit"],
            [([i.name], i.waiting) for i in infos],
        )
        yield labelled(
            GaugeMetricFamily,
            "limit_tokens",
            "Each limit's tokens: used (charged by committed executions, all keys) and left "
            "(its token bucket now, for a limit without per).",
            ["limit", "state"],
            [([i.name, "used"], i.used_tokens) for i in infos]
            + [([i.name, "left"], i.tokens_left) for i in infos if i.tokens_left is not None],
        )
        yield labelled(
            GaugeMetricFamily,
            "limit_rate_level",
            "Starts each limit's rate bucket holds now (a limit with a rate and without per).",
            ["limit"],
            [([i.name], i.level) for i in infos if i.level is not None],
        )

    def _webhooks(self) -> Iterator[Metric]:
        """Webhook delivery (B20), from each delivery run's committed record: the same on
        each supervisor of one database (aggregate with ``max``)."""
        infos = self.probe.webhooks
        yield labelled(
            CounterMetricFamily,
            "webhook_deliveries",
            "Events each webhook's receiver accepted (a redelivery after a takeover counts once).",
            ["webhook"],
            [([i.name], i.delivered) for i in infos],
        )
        yield labelled(
            CounterMetricFamily,
            "webhook_dead_letters",
            "Events each webhook gave up on after its max_failures.",
            ["webhook"],
            [([i.name], i.dead_total) for i in infos],
        )
        yield labelled(
            GaugeMetricFamily,
            "webhook_failing",
            "Failed deliveries in a row of the event each webhook is stuck on (0: healthy).",
            ["webhook"],
            [([i.name], i.failures) for i in infos],
        )
        yield labelled(
            GaugeMetricFamily,
            "webhook_cursor",
            "The last event id each webhook has dealt with (compare with the newest event).",
            ["webhook"],
            [([i.name], i.cursor) for i in infos],
        )

    def _fencing(self) -> Iterator[Metric]:
        probe = self.probe
        yield counter(
            "zombie_writes_rejected_total",
            "Writes by a former lease holder that the database refused (fence_rejections).",
            sum(probe.rejections.values()),
        )
        yield labelled(
            CounterMetricFamily,
            "fence_rejections_total",
            "Refused writes by operation (renew, ack, compare_and_set, finish, advance...).",
            ["op"],
            [([op], n) for op, n in sorted(probe.rejections.items())],
        )
        yield counter(
            "lease_losses_total",
            "Leases (task, attempt) whose holder wrote after losing them, as the database saw.",
            probe.lost_leases,
        )
        age = probe.age(self.arb.clock())
        yield gauge(
            "store_up",
            "1 if the last database read succeeded.",
            1 if probe.error is None and age is not None else 0,
        )
        if age is not None:
            yield gauge(
                "store_read_age_seconds",
                "Seconds since the database last answered the supervisor.",
                round(age, 3),
            )
        yield counter(
            "store_read_failures_total",
            "Database reads by the supervisor that failed.",
            probe.failures,
        )

    def _work(self) -> Iterator[Metric]:
        work = self.tally.work(self.arb)
        yield counter(
            "claims_total",
            "Leases handed to this supervisor's workers (each claim, takeovers included).",
            work.claims,
        )
        yield counter(
            "takeovers_total",
            "Claims of a task whose previous lease had expired or was released as dead.",
            work.takeovers,
        )
        yield counter(
            "batch_calls_total",
            "Calls of batch steps' handlers (@app.task(batch=...)); items per call is "
            "batch_items_total / batch_calls_total.",
            work.batches,
        )
        yield counter(
            "batch_items_total",
            "Items (runs' tasks) taken by batch steps' calls.",
            work.batch_items,
        )
        durations = HistogramMetricFamily(
            PREFIX + "task_duration_seconds",
            "Time in handlers, per execution (failed and interrupted ones included).",
        )
        durations.add_metric([], cumulative(DURATION_BOUNDS, work.buckets), work.seconds)
        yield durations

    def _workers(self) -> Iterator[Metric]:
        arb, tally = self.arb, self.tally
        yield gauge("workers_target", "Workers the supervisor keeps alive.", arb.pool.target)
        phases: Counter[str] = Counter()
        busy = 0
        for w in arb.pool.workers.values():
            slot = arb.board.read(w.slot)
            mine = slot is not None and slot.pid == w.pid
            phases[slot.phase_name if slot and mine else "starting"] += 1
            busy += slot.busy if slot and mine else 0
        yield labelled(
            GaugeMetricFamily,
            "workers",
            "Worker processes by phase (as each one publishes it).",
            ["phase"],
            [([p], phases.get(p, 0)) for p in ("starting", *PHASE_NAMES)],
        )
        total = len(arb.pool.workers) * arb.config.worker.concurrency
        yield labelled(
            GaugeMetricFamily,
            "slots",
            "Handler slots of the live workers (--concurrency each): busy running a handler, "
            "or free.",
            ["state"],
            [(["busy"], busy), (["free"], max(0, total - busy))],
        )
        yield counter("worker_starts_total", "Workers forked.", tally.worker_starts)
        yield labelled(
            CounterMetricFamily,
            "worker_exits_total",
            "Workers reaped, by kind (crashed, retired, recycled, stopped, boot_failure) "
            "and reason (signal, exit code, or why the supervisor retired it).",
            ["kind", "reason"],
            [([kind, reason], n) for (kind, reason), n in sorted(tally.exits.items())],
        )
        yield counter(
            "leases_released_total",
            "Leases of dead workers expired at once by the supervisor (fast release).",
            tally.leases_released,
        )
        yield counter("reloads_total", "Rolling restarts started by SIGHUP.", tally.reloads)
        faults = sorted({"kill", "pause", *tally.chaos_faults})
        yield labelled(
            CounterMetricFamily,
            "chaos_faults_total",
            "Faults injected by chaos mode, by kind.",
            ["fault"],
            [([f], tally.chaos_faults.get(f, 0)) for f in faults],
        )
        yield gauge("generation", "Worker generation (+1 per reload).", arb.pool.generation)

    def _supervisor(self) -> Iterator[Metric]:
        yield gauge(
            "supervisor_start_time_seconds",
            "Unix time the supervisor started.",
            round(self.tally.started_wall, 3),
        )
        yield labelled(
            GaugeMetricFamily,
            "supervisor_info",
            "The supervisor's pid and phase.",
            ["pid", "phase"],
            [([str(os.getpid()), str(self.arb.phase)], 1)],
        )


@dataclass
class Metrics:
    """The tally, subscribed to the arbiter, and its exposition on a private registry."""

    probe: StatsProbe
    max_age: float = 1.0  # a scrape re-reads the database when the cache is older than this
    tally: Tally = field(default_factory=Tally)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def install(self, arb: Arbiter) -> None:
        self.tally.install(arb)
        self.registry.register(SupervisorCollector(self.probe, self.tally, arb))

    def render(self, arb: Arbiter) -> str:
        self.probe.at_most(arb, self.max_age)  # refresh the cached read if it is too old
        return generate_latest(self.registry).decode()
