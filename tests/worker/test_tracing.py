"""OpenTelemetry traces: each run keeps the W3C traceparent of the span that
started it (both backends, plain and gated claims), and each step execution is a span in that
trace with its run id, task, attempt, queue and outcome, a takeover as its event, errors as its
status. In process, with the SDK's in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import FakeClock
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from workerproc import App, RetryAfter, TaskContext, tracing
from workerproc.config import WorkerConfig
from workerproc.execution import Execution, Mode, conclude
from workerproc.store import Commit, InvalidPayload, Store, TaskOptions
from workerproc.store.limits import LimitSpec
from workerproc.testing import run_inline, temporary_store

TTL = 30.0
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_exporter = InMemorySpanExporter()


def _provider() -> TracerProvider:
    """The process's SDK provider (set once per process: the API allows no second one)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
    return provider


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _provider()
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def steps(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [x for x in exporter.get_finished_spans() if x.name.startswith("step ")]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


class TestTheColumn:
    def test_an_explicit_traceparent_reaches_the_lease(self, s: Store) -> None:
        run_id = s.start_run("a", traceparent=PARENT)
        lease = s.claim("w", TTL)
        assert lease is not None and lease.run_id == run_id and lease.traceparent == PARENT

    def test_start_runs_and_none_outside_a_span(self, s: Store) -> None:
        s.start_runs([{"task": "a", "traceparent": PARENT}, {"task": "b"}])
        leases = s.claim("w", TTL, limit=2)
        assert [x.traceparent for x in leases] == [PARENT, None]

    def test_task_objects_pass_an_explicit_traceparent(self, s: Store) -> None:
        app = App()

        @app.task
        def first(ctx: TaskContext) -> None: ...

        one = first.start(store=s, traceparent=PARENT)
        many = first.start_many([1, 2], store=s, traceparent=PARENT)
        leases = s.claim("w", TTL, limit=3)
        assert sorted(x.run_id for x in leases) == sorted([one, *many])
        assert {x.traceparent for x in leases} == {PARENT}

    def test_the_current_span_is_captured(self, s: Store, spans: InMemorySpanExporter) -> None:
        with trace.get_tracer("t").start_as_current_span("request") as span:
            s.start_run("a")
        lease = s.claim("w", TTL)
        ctx = span.get_span_context()
        assert lease is not None
        flags = int(ctx.trace_flags)
        assert lease.traceparent == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{flags:02x}"

    def test_empty_means_none_and_a_bad_one_is_refused(
        self, s: Store, spans: InMemorySpanExporter
    ) -> None:
        with trace.get_tracer("t").start_as_current_span("request"):
            s.start_run("a", traceparent="")
        lease = s.claim("w", TTL)
        assert lease is not None and lease.traceparent is None
        for bad in ("00-zz", PARENT.upper(), "00-" + "0" * 32 + "-b7ad6b7169203331-01", 7):
            with pytest.raises(InvalidPayload, match="traceparent"):
                s.start_run("a", traceparent=bad)  # type: ignore[arg-type]

    def test_a_gated_claim_carries_it(self, s: Store) -> None:
        s.register_tasks({"call": TaskOptions(limits=("api",))})
        assert s.declare_limits({"api": LimitSpec.declare("api", concurrency=2)}, by="t") == []
        s.start_run("call", traceparent=PARENT)
        (lease,) = s.claim("w", TTL, limit=2)
        assert lease.gates and lease.traceparent == PARENT

    def test_a_takeover_knows_whose_lease_it_took(self, s: Store, clock: FakeClock) -> None:
        s.start_run("a")
        first = s.claim("w1", TTL)
        assert first is not None
        clock.advance(TTL + 1)
        again = s.claim("w2", TTL)
        assert again is not None and again.takeover
        assert (again.previous_owner, again.previous_attempt) == ("w1", first.attempt)


def _app() -> App:
    app = App()

    @app.task()
    def first(ctx: TaskContext) -> None:
        with trace.get_tracer("h").start_as_current_span("inside"):
            pass
        ctx.advance({"n": 1}, next="second")

    @app.task(queue="q2")
    def second(ctx: TaskContext) -> None:
        ctx.finish({"n": 2})

    @app.task()
    def boom(ctx: TaskContext) -> None:
        raise ValueError("no")

    said: list[bool] = []

    @app.task()
    def later(ctx: TaskContext) -> None:
        if not said:
            said.append(True)
            raise RetryAfter(0.01)
        ctx.finish({})

    return app


class TestSpans:
    def test_each_step_is_a_span_in_the_starters_trace(self, spans: InMemorySpanExporter) -> None:
        with trace.get_tracer("t").start_as_current_span("request") as request:
            run = run_inline(_app(), "first")
        assert run.status == "succeeded"
        got = steps(spans)
        assert [x.name for x in got] == ["step first", "step second"]
        ctx = request.get_span_context()
        for span in got:
            assert span.context is not None and span.context.trace_id == ctx.trace_id
            assert span.parent is not None and span.parent.span_id == ctx.span_id
            assert span.kind is trace.SpanKind.CONSUMER
        one, two = (attrs(x) for x in got)
        assert one["leasekeeper.run_id"] == two["leasekeeper.run_id"] == run.id
        assert (one["leasekeeper.task"], one["leasekeeper.attempt"]) == ("first", 1)
        assert (one["leasekeeper.outcome"], one["leasekeeper.commit"]) == ("committed", "advance")
        assert (two["leasekeeper.queue"], two["leasekeeper.commit"]) == ("q2", "finish")
        inside = [x for x in spans.get_finished_spans() if x.name == "inside"]
        assert inside[0].parent is not None and got[0].context is not None
        assert inside[0].parent.span_id == got[0].context.span_id  # the handler's own, nested

    def test_a_failure_sets_the_status(self, spans: InMemorySpanExporter) -> None:
        run = run_inline(_app(), "boom", raise_errors=False, max_attempts=2)
        assert run.status == "failed"
        got = steps(spans)
        assert [attrs(x)["leasekeeper.outcome"] for x in got] == ["released", "failed"]
        assert all(x.status.status_code is StatusCode.ERROR for x in got)
        assert got[0].events[0].name == "exception"
        assert got[0].context is not None and got[1].context is not None
        assert got[0].context.trace_id != got[1].context.trace_id  # no starter: roots

    def test_retry_after_is_no_error(self, spans: InMemorySpanExporter) -> None:
        run_inline(_app(), "later", raise_errors=False)
        got = steps(spans)
        assert [attrs(x)["leasekeeper.outcome"] for x in got] == ["retry_after", "committed"]
        assert got[0].status.status_code is StatusCode.UNSET

    def test_a_takeover_is_an_event_and_a_lost_write_an_outcome(
        self, spans: InMemorySpanExporter, clock: FakeClock
    ) -> None:
        with temporary_store(clock=clock) as store:
            store.start_run("second", traceparent=PARENT)
            stale = store.claim("w1", TTL)
            clock.advance(TTL + 1)
            lease = store.claim("w2", TTL)
            assert stale is not None and lease is not None
            app = _app()
            for held in (stale, lease):
                ex = Execution(held, app.handlers["second"], Mode.INLINE, tasks=app.tasks)
                with ex.running():
                    ex.handler(ex.ctx)
                commit = conclude(ex, None, None, config=_config(store))
                assert commit is not None
                out = store.commit_many([commit])
                tracing.ended(commit, out.results[0])
        lost, taken = steps(spans)
        assert attrs(lost)["leasekeeper.outcome"] == "lease_lost"
        assert lost.status.status_code is StatusCode.ERROR
        assert attrs(taken)["leasekeeper.outcome"] == "committed"
        (event,) = [e for e in taken.events if e.name == "lease.taken_over"]
        assert dict(event.attributes or {}) == {"previous_owner": "w1",
                                                "previous_attempt": stale.attempt}  # fmt: skip
        assert taken.context is not None and taken.context.trace_id == int(PARENT[3:35], 16)


def _config(store: Store) -> WorkerConfig:
    return WorkerConfig(db=store.url, app="t:app")


def test_nothing_is_traced_without_a_recording_span(s: Store) -> None:
    s.start_run("a")
    lease = s.claim("w", TTL)
    assert lease is not None
    assert s.commit_many([Commit(lease, "finish", new_state={})]).results[0].value == "ok"


def test_without_the_extra_nothing_imports_it() -> None:
    """opentelemetry made unimportable: runs start and run as before, and no module of it is
    loaded (the guarded imports in ``workerproc.tracing`` and ``workerproc.store.traceparent`` are
    the only ones)."""
    code = """
import sys
sys.modules["opentelemetry"] = None  # importing it raises ImportError
from workerproc import App
from workerproc.testing import run_inline
app = App()

@app.task()
def step(ctx):
    ctx.finish({"done": True})

assert run_inline(app, "step").status == "succeeded"
assert not [m for m in sys.modules if m.startswith("opentelemetry.")], "imported"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr
