"""Prometheus metrics, computed in the supervisor and written in the text format by hand.

Why not prometheus-client: its multiprocess mode expects every process to write its own metric
files into a shared directory (``PROMETHEUS_MULTIPROC_DIR``) and the scraper to merge them. Our
workers record nothing of the sort: what operators need is in the database (runs, tasks, leases)
and in the supervisor itself (which worker exited, why, what it restarted). The client's single
process registry would add a dependency for a few dozen lines of text format, and its default
collectors and HTTP server start threads, which the supervisor must never run (it forks).

Two sources:
- the database, through the shared ``StatsProbe`` (one short session per read, re-read only when
  a scrape finds the cache older than ``max_age``): runs by status, tasks by state, and the
  writes the fence refused (zombie writes rejected, by operation; lease losses);
- the arbiter's event bus: worker starts, exits by kind and reason, reloads, chaos faults
  (``chaos_fault``) and leases fast-released after a worker died (``leases_released``);
- the workers' shared-memory status slots: claims, takeovers, handler times (below).

Database-wide numbers (runs, tasks, refused writes) are the same for every supervisor sharing
one database: aggregate them across hosts with ``max``, never ``sum``. Refused writes are read
incrementally from ``fence_rejections`` and counted from the start of the table, so those
counters survive supervisor restarts.

Claims, takeovers and the task duration histogram come from the workers themselves: each counts
into its shared-memory status slot after every task (no database write), the supervisor sums the
live slots and banks a reaped worker's last counts. They cover this supervisor's workers since it
started (sum them across hosts).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workerproc import exitcodes as wexit
from workerproc.status import DURATION_BOUNDS, PHASE_NAMES, Counters, StatusBoard
from workerproc.store.types import RUN_STATUSES

from ..loop.arbiter import Arbiter
from ..loop.pool import Exit, ExitKind
from ..loop.signals import name as signal_name
from .probe import StatsProbe

PREFIX = "leasekeeper_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TASK_STATES = ("ready", "delayed", "leased", "expired")
Labels = dict[str, str]
Sample = tuple[str, Labels, float]  # suffix ("" or _bucket/_sum/_count), labels, value


# -- the text format ---------------------------------------------------------------------------
def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(value)


def family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> str:
    """One metric family: ``# HELP``, ``# TYPE`` and its sample lines."""
    full = PREFIX + name
    lines = [f"# HELP {full} {_escape_help(help_text)}", f"# TYPE {full} {kind}"]
    for suffix, labels, value in samples:
        body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
        lines.append(
            f"{full}{suffix}{{{body}}} {_number(value)}"
            if body
            else f"{full}{suffix} {_number(value)}"
        )
    return "\n".join(lines) + "\n"


def histogram(bounds: Sequence[float], values: Iterable[float], labels: Labels) -> list[Sample]:
    """Cumulative ``_bucket`` samples (``le`` ends with +Inf), then ``_sum`` and ``_count``."""
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    n = 0
    for v in values:
        n += 1
        total += v
        i = next((i for i, b in enumerate(bounds) if v <= b), len(bounds))
        counts[i] += 1
    samples: list[Sample] = []
    running = 0
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        running += count
        samples.append(("_bucket", {**labels, "le": _number(bound)}, running))
    samples += [("_sum", labels, total), ("_count", labels, n)]
    return samples


def histogram_counts(
    bounds: Sequence[float], counts: Sequence[int], total: float, labels: Labels
) -> list[Sample]:
    """Like ``histogram`` from per-bucket counts already made (the workers bucket their own)."""
    samples: list[Sample] = []
    running = 0
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        running += count
        samples.append(("_bucket", {**labels, "le": _number(bound)}, running))
    return [*samples, ("_sum", labels, total), ("_count", labels, running)]


# -- what the supervisor counts ----------------------------------------------------------------
def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unknown"


def exit_reason(ex: Exit) -> str:
    """Why a worker exited, as a low-cardinality label value."""
    worker = ex.worker
    if worker.expected_death:
        return "chaos"
    if ex.kind is ExitKind.RETIRED and worker.retiring:
        return _slug(worker.retiring)  # stop, reload, memory, scale down, graceful timeout...
    if ex.signal is not None:
        return signal_name(ex.signal)
    return _slug(wexit.describe(ex.code if ex.code is not None else -1))


@dataclass
class Metrics:
    probe: StatsProbe
    max_age: float = 1.0  # a scrape re-reads the database when the cache is older than this
    started_wall: float = field(default_factory=time.time)
    worker_starts: int = 0
    exits: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, reason)
    reloads: int = 0
    chaos_faults: Counter[str] = field(default_factory=Counter)
    leases_released: int = 0
    banked: Counters = field(default_factory=Counters)  # what reaped workers had counted
    board: StatusBoard | None = None

    def install(self, arb: Arbiter) -> None:
        self.board = arb.board
        arb.events.on("worker_started", self._on_started)
        arb.events.on("worker_exited", self._on_exited)
        arb.events.on("reloading", self._on_reloading)
        arb.events.on("chaos_fault", self._on_chaos_fault)
        arb.events.on("leases_released", self._on_leases_released)

    def _on_started(self, **_: Any) -> None:
        self.worker_starts += 1

    def _on_exited(self, exit: Exit, **_: Any) -> None:
        self.exits[(str(exit.kind), exit_reason(exit))] += 1
        if self.board is not None:  # its slot keeps its last counters until a new worker starts
            counted = self.board.slot(exit.worker.slot).read_counters(exit.worker.pid)
            if counted is not None:
                self.banked.add(counted)

    def work(self, arb: Arbiter) -> Counters:
        """Claims, takeovers and handler times: reaped workers' totals plus the live ones'."""
        total = Counters()
        total.add(self.banked)
        for w in arb.pool.workers.values():
            counted = arb.board.slot(w.slot).read_counters(w.pid)
            if counted is not None:
                total.add(counted)
        return total

    def _on_reloading(self, **_: Any) -> None:
        self.reloads += 1

    def _on_chaos_fault(self, fault: str, **_: Any) -> None:
        self.chaos_faults[_slug(fault)] += 1

    def _on_leases_released(self, count: int, **_: Any) -> None:
        self.leases_released += count

    def render(self, arb: Arbiter) -> str:
        stats = self.probe.at_most(arb, self.max_age)
        now = arb.clock()
        out: list[str] = []
        if stats is not None:
            runs = {s: stats.runs.get(s, 0) for s in RUN_STATUSES} | dict(stats.runs)
            out.append(
                family(
                    "runs",
                    "gauge",
                    "Runs in the database by status.",
                    [("", {"status": s}, n) for s, n in sorted(runs.items())],
                )
            )
            counts = (stats.ready, stats.delayed, stats.leased, stats.expired)
            out.append(
                family(
                    "tasks",
                    "gauge",
                    "Pending tasks: ready to claim, delayed, under a live lease, lease expired.",
                    [("", {"state": s}, n) for s, n in zip(TASK_STATES, counts, strict=True)],
                )
            )
        out += self._fencing()
        age = self.probe.age(now)
        out.append(
            family(
                "store_up",
                "gauge",
                "1 if the last database read succeeded.",
                [("", {}, 1 if self.probe.error is None and age is not None else 0)],
            )
        )
        if age is not None:
            out.append(
                family(
                    "store_read_age_seconds",
                    "gauge",
                    "Seconds since the database last answered the supervisor.",
                    [("", {}, round(age, 3))],
                )
            )
        out.append(
            family(
                "store_read_failures_total",
                "counter",
                "Database reads by the supervisor that failed.",
                [("", {}, self.probe.failures)],
            )
        )
        out += self._workers(arb)
        return "".join(out)

    def _fencing(self) -> list[str]:
        probe = self.probe
        by_op: list[Sample] = [("", {"op": op}, n) for op, n in sorted(probe.rejections.items())]
        return [
            family(
                "zombie_writes_rejected_total",
                "counter",
                "Writes by a former lease holder that the database refused (fence_rejections).",
                [("", {}, sum(probe.rejections.values()))],
            ),
            family(
                "fence_rejections_total",
                "counter",
                "Refused writes by operation (renew, ack, compare_and_set, finish, advance...).",
                by_op,
            ),
            family(
                "lease_losses_total",
                "counter",
                "Leases (task, attempt) whose holder wrote after losing them, as the database saw.",
                [("", {}, probe.lost_leases)],
            ),
        ]

    def _workers(self, arb: Arbiter) -> list[str]:
        phases: Counter[str] = Counter()
        for w in arb.pool.workers.values():
            slot = arb.board.read(w.slot)
            phases[slot.phase_name if slot and slot.pid == w.pid else "starting"] += 1
        phase_samples: list[Sample] = [
            ("", {"phase": p}, phases.get(p, 0)) for p in ("starting", *PHASE_NAMES)
        ]
        exits: list[Sample] = [
            ("", {"kind": kind, "reason": reason}, n)
            for (kind, reason), n in sorted(self.exits.items())
        ]
        faults: list[Sample] = [
            ("", {"fault": f}, self.chaos_faults.get(f, 0))
            for f in sorted({"kill", "pause", *self.chaos_faults})
        ]
        work = self.work(arb)
        return [
            family(
                "claims_total",
                "counter",
                "Leases handed to this supervisor's workers (each claim, takeovers included).",
                [("", {}, work.claims)],
            ),
            family(
                "takeovers_total",
                "counter",
                "Claims of a task whose previous lease had expired or was released as dead.",
                [("", {}, work.takeovers)],
            ),
            family(
                "task_duration_seconds",
                "histogram",
                "Time in handlers, per execution (failed and interrupted ones included).",
                histogram_counts(DURATION_BOUNDS, work.buckets, work.seconds, {}),
            ),
            family(
                "workers_target",
                "gauge",
                "Workers the supervisor keeps alive.",
                [("", {}, arb.pool.target)],
            ),
            family(
                "workers",
                "gauge",
                "Worker processes by phase (as each one publishes it).",
                phase_samples,
            ),
            family(
                "worker_starts_total", "counter", "Workers forked.", [("", {}, self.worker_starts)]
            ),
            family(
                "worker_exits_total",
                "counter",
                "Workers reaped, by kind (crashed, retired, recycled, stopped, boot_failure) "
                "and reason (signal, exit code, or why the supervisor retired it).",
                exits,
            ),
            family(
                "leases_released_total",
                "counter",
                "Leases of dead workers expired at once by the supervisor (fast release).",
                [("", {}, self.leases_released)],
            ),
            family(
                "reloads_total",
                "counter",
                "Rolling restarts started by SIGHUP.",
                [("", {}, self.reloads)],
            ),
            family(
                "chaos_faults_total", "counter", "Faults injected by chaos mode, by kind.", faults
            ),
            family(
                "generation",
                "gauge",
                "Worker generation (+1 per reload).",
                [("", {}, arb.pool.generation)],
            ),
            family(
                "supervisor_start_time_seconds",
                "gauge",
                "Unix time the supervisor started.",
                [("", {}, round(self.started_wall, 3))],
            ),
            family(
                "supervisor_info",
                "gauge",
                "The supervisor's pid and phase.",
                [("", {"pid": str(os.getpid()), "phase": str(arb.phase)}, 1)],
            ),
        ]
