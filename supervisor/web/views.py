"""The pages. Each is a plain function of the request that reads the store and renders a
template; with the ``X-Fragment`` header (what ``static/dashboard.js`` sends when it polls) only
the live part of the page is rendered. Every read is a read: none takes the write lock."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from workerproc.store import Inspector, Stats
from workerproc.store.streams import MAX_READ, step_texts
from workerproc.store.types import RUN_STATUSES

from ..errors import NotRunning
from ..loop.pidfile import live_pid, read_state
from ..operations.actions import with_waits, worker_rows
from . import chaos, charts, timeline
from .config import WebConfig
from .security import Secrets, session_of

T = TypeVar("T")
MAX_ID = 2**63 - 1  # SQLite's largest integer: a bigger id names no run
MAX_BATCHES = 1000  # a run page reads at most this many of its events for its batches
PAGE = 50
STATS_EVERY = 1.0  # seconds: every open overview shares one read of the counts per second
CHART_EVERY = 10.0  # the chart reads up to CHART_RUNS runs: at most once per 10 s
CHART_RUNS = 200_000
LIMIT_KEYS = 10  # the busiest keys the limits page shows of each limit
TREE_DEPTH = 4  # a run page's tree of child runs: this many generations below it
TREE_RUNS = 200  # and at most this many runs in all
DONE = (
    "retried",
    "cancelled",
    "signalled",
    "resolved",
    "forked",
)  # what an action's redirect may say


def _per_minute(value: float | None) -> str:
    return "-" if value is None else f"{value * 60:g}/m"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}" if value == int(value) else f"{value:.1f}"


class _Cache:
    """The last value of each read and when it was made; one reader refreshes it at a time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._values: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def get(self, key: str, max_age: float, read: Callable[[], T]) -> T:
        with self._lock:
            hit = self._values.get(key)
            if hit is not None and self._clock() - hit[0] < max_age:
                return hit[1]  # type: ignore[no-any-return]
            value = read()
            self._values[key] = (self._clock(), value)
            return value


def not_found(detail: str) -> HTTPException:
    return HTTPException(404, detail)


_ID = re.compile(r"[0-9]{1,19}")  # ASCII digits: str.isdigit() takes "²" and "٣" too


def _id(text: str | None, what: str) -> int | None:
    if text is None or text == "":
        return None
    if not _ID.fullmatch(text) or int(text) > MAX_ID:
        raise not_found(f"{what} must be a run id (got {text[:40]!r})")
    return int(text)


class Pages:
    def __init__(
        self, config: WebConfig, store: Inspector, templates: Jinja2Templates, keys: Secrets
    ) -> None:
        self.config = config
        self.store = store
        self.templates = templates
        self.keys = keys
        self.cache = _Cache()
        self.report = chaos.ReportFile(config.chaos_report) if config.chaos_report else None

    # -- rendering -------------------------------------------------------------------------------
    def render(self, request: Request, name: str, **ctx: Any) -> Response:
        fragment = request.headers.get("x-fragment") == "1"
        context = {
            "config": self.config,
            "now": self.store.now(),
            "csrf": self.keys.csrf_token(session_of(request)),
            "path": request.url.path,
            "statuses": RUN_STATUSES,
            **ctx,
        }
        template = f"_{name}" if fragment else name
        return self.templates.TemplateResponse(request, template, context)

    def stats(self) -> Stats:
        return self.cache.get("stats", STATS_EVERY, self.store.stats)

    # -- pages -----------------------------------------------------------------------------------
    def overview(self, request: Request) -> Response:
        stats = self.stats()
        chart = self.cache.get("chart", CHART_EVERY, self._throughput)
        supervisor, workers, down = self._supervisor(stats)
        pool = self.cache.get("pool", STATS_EVERY, self.store.workers)
        return self.render(request, "overview.html", stats=stats, chart=chart,
                           supervisor=supervisor, workers=workers, down=down,
                           pool=pool)  # fmt: skip

    def _throughput(self) -> charts.Chart:
        since = (self.store.now() // 60 - 59) * 60  # 60 whole minutes, this one the last
        return charts.throughput(self.store.finished_since(since, 60, newest=CHART_RUNS), since)

    def _supervisor(
        self, stats: Stats
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str | None]:
        if self.config.pidfile is None:
            return None, [], None
        try:
            live_pid(self.config.pidfile)
        except NotRunning as exc:
            return None, [], str(exc)
        state = read_state(self.config.pidfile)
        if state is None:
            return None, [], "the supervisor has not written its state file yet"
        return state, worker_rows(state, stats), None

    def runs(self, request: Request) -> Response:
        q = request.query_params
        wanted = q.get("q", "").strip().lstrip("#")
        if wanted:
            run_id = _id(wanted, "the search")
            if run_id is None or self.store.get_run(run_id) is None:
                raise not_found(f"no run {wanted[:40]}")
            return RedirectResponse(f"/runs/{run_id}", status_code=303)
        status = q.get("status") or None
        if status is not None and status not in RUN_STATUSES:
            raise not_found(f"no status {status[:40]!r} (one of {', '.join(RUN_STATUSES)})")
        task = q.get("task") or None
        if task is not None and len(task) > 200:
            raise not_found("no such task")
        before, after = _id(q.get("before"), "before"), _id(q.get("after"), "after")
        if before is not None and after is not None:
            raise not_found("a page is before a run or after one, not both")
        system = q.get("all") == "1"  # the system's own runs too (the webhooks' deliveries)
        page = self.store.runs_page(status, task, before=before, after=after, limit=PAGE + 1,
                                    system=system)  # fmt: skip
        page = with_waits(self.store, page)
        more = len(page) > PAGE
        if after is not None:  # the extra run is the newest one: there are newer pages
            runs, newer, older = page[-PAGE:], more, True
        else:
            runs, newer, older = page[:PAGE], before is not None, more
        filters = {k: v for k, v in (("status", status), ("task", task),
                                     ("all", "1" if system else None)) if v}  # fmt: skip
        return self.render(request, "runs.html", runs=runs, status=status, task=task,
                           filters=filters, newer=newer and bool(runs), older=older and bool(runs),
                           tasks=self.store.task_names(system=system), system=system)  # fmt: skip

    def run(self, request: Request) -> Response:
        run_id = int(request.path_params["run_id"])
        found = self.store.get_run(run_id) if run_id <= MAX_ID else None
        if found is None:
            raise not_found(f"no run {run_id}")
        (run,) = with_waits(self.store, [found])  # "no worker serves task X" (B22)
        tasks = self.store.get_tasks(run_id)
        now = self.store.now()
        lines = timeline.build(tasks, self.store.attempt_history(run_id),
                               self.store.run_rejections(run_id), now)  # fmt: skip
        ends = [run.finished_at or now] + [a.ended_at or 0.0 for t in lines for a in t.attempts]
        chart = charts.run_timeline(lines, run.created_at, max(ends))
        done = request.query_params.get("done")
        calls, intents = self.store.paid_calls(run_id), self.store.call_timeline(run_id)
        events = self.store.events(0, MAX_BATCHES, run=run_id, system=True)
        batches = [e for e in events if e.kind == "step.batched"]  # its batch calls (B23)
        forked = next((e.data for e in events if e.kind == "run.forked"), None)  # (B24)
        return self.render(request, "run.html", run=run, timeline=lines, chart=chart,
                           calls=calls, intents=intents, batches=batches, steps=tasks,
                           forked=forked,
                           unresolved=timeline.unresolved(run, calls, intents),
                           done=done if done in DONE else None,
                           children=children_tree(self.store, run_id),
                           stream=self._stream(run_id))  # fmt: skip

    def _stream(self, run_id: int) -> tuple[dict[int, str], int]:
        """The run's stream as it stands (each step's text, B21) and its last offset read: the
        page follows it live from there (``/runs/{id}/stream``)."""
        chunks = self.store.stream(run_id, 0, MAX_READ)
        return step_texts(chunks), chunks[-1].offset if chunks else 0

    def leases(self, request: Request) -> Response:
        return self.render(request, "leases.html", stats=self.stats())

    def limits(self, request: Request) -> Response:
        """Flow control: each limit, its use now and its busiest keys."""
        infos = self.cache.get("limits", STATS_EVERY, lambda: self.store.limits(keys=LIMIT_KEYS))
        return self.render(request, "limits.html", limits=infos, permin=_per_minute, num=_num)

    def webhooks(self, request: Request) -> Response:
        """Webhooks (B20): each one's delivery record and its dead letters."""
        infos = self.cache.get("webhooks", STATS_EVERY, self.store.webhooks)
        return self.render(request, "webhooks.html", webhooks=infos)

    def chaos(self, request: Request) -> Response:
        report = self.report.read() if self.report else None
        ctx: dict[str, Any] = {"report": report}
        if report is not None and report.problem is None:
            ctx["faults"] = charts.faults(report.events)
            ctx["histogram"] = charts.histogram(report.latencies())
        return self.render(request, "chaos.html", **ctx)


def children_tree(store: Any, run_id: int) -> list[dict[str, Any]]:
    """The runs ``run_id`` spawned, and theirs, oldest first: each node ``id``, ``status``,
    ``task`` and its own ``children``, down ``TREE_DEPTH`` generations and ``TREE_RUNS`` runs."""
    left = [TREE_RUNS]

    def below(parent: int, depth: int) -> list[dict[str, Any]]:
        if depth >= TREE_DEPTH or left[0] <= 0:
            return []
        rows = store.run_children(parent, limit=left[0])
        left[0] -= len(rows)
        return [{"id": i, "status": status, "task": task, "children": below(i, depth + 1)}
                for i, status, task in rows]  # fmt: skip

    return below(run_id, 0)
