"""OpenTelemetry traces (the optional ``otel`` extra): with ``workerproc.store.traceparent``
(the producer side, owned by the store) the only modules that import it.

Nothing here imports OpenTelemetry unless tracing is asked for: a span records only under a
tracer provider, which the app (or ``opentelemetry-instrument``) set up, having imported it,
or ``configure`` did from the ``OTEL_*`` environment. Until then every function here is a
cheap no-op, and a worker does not pay for the import. With it:

- (in ``workerproc.store.traceparent``) the W3C ``traceparent`` of the caller's recording span,
  stored with each run it starts (``start_run``, ``start_runs``, transactional enqueue,
  ``ctx.spawn``).
- ``begin``/``concluded``/``ended``: one span per step execution, whose parent is the run's
  stored ``traceparent`` (so every step of a run is a child of the span that started it, in its
  trace), with the run id, task, attempt, queue and outcome as attributes and a takeover as
  the ``lease.taken_over`` event. It ends once the step's last word is written (its outcome).
- ``configure``: in a worker process, after fork, a ``TracerProvider`` set up from the
  standard ``OTEL_*`` environment variables when an exporter is named there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store.types import Commit, Lease

log = logging.getLogger("workerproc.worker")

TRACER = "leasekeeper"
# a commit's kind, written: the step's outcome
OUTCOMES = {"finish": "committed", "advance": "committed", "wait": "committed",
            "spawn": "committed", "release": "released", "fail": "failed", "drop": "dropped",
            "handback": "handed_back", "retry_after": "retry_after"}  # fmt: skip
_open: dict[tuple[int, str, int], Any] = {}  # lease fence -> its step's span, until written
_provider: Any = None  # the provider ``configure`` set up (shut down by ``shutdown``)


def _trace() -> Any:
    """``opentelemetry.trace`` when someone loaded it (None: nothing can record a span)."""
    return sys.modules.get("opentelemetry.trace")


def begin(lease: Lease) -> Any:
    """The span of one execution of ``lease``'s task (None: nothing traces it)."""
    trace = _trace()
    if trace is None:
        return None
    from opentelemetry.context import Context  # noqa: PLC0415 - loaded with it
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    parent = Context()  # no stored trace context: the step is a root of its own
    if lease.traceparent:
        parent = TraceContextTextMapPropagator().extract({"traceparent": lease.traceparent})
    span = trace.get_tracer(TRACER).start_span(
        f"step {lease.task}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes={"leasekeeper.run_id": lease.run_id, "leasekeeper.task": lease.task,
                    "leasekeeper.task_id": lease.task_id, "leasekeeper.attempt": lease.attempt,
                    "leasekeeper.queue": lease.queue, "leasekeeper.owner": lease.owner},
    )  # fmt: skip
    if not span.is_recording():
        return None
    if lease.takeover:
        previous: dict[str, Any] = {}
        if lease.previous_owner is not None:
            previous["previous_owner"] = lease.previous_owner
        if lease.previous_attempt is not None:
            previous["previous_attempt"] = lease.previous_attempt
        span.add_event("lease.taken_over", previous)
    _open[lease.fence] = span
    return span


@contextlib.contextmanager
def current(span: Any) -> Iterator[None]:
    """``span`` is the current span inside (the handler's own spans are its children)."""
    if span is None:
        yield
        return
    with _trace().use_span(span, end_on_exit=False, record_exception=False,
                        set_status_on_exception=False):  # fmt: skip
        yield


def concluded(lease: Lease, span: Any, raised: BaseException | None, commit: Commit | None) -> None:
    """``lease``'s handler ended: an error it raised is recorded; nothing to write (its lease
    is lost) ends its span now."""
    if span is None:
        return
    from .limits import RetryAfter  # noqa: PLC0415 (only when traced)

    if raised is not None and not isinstance(raised, RetryAfter):
        span.record_exception(raised)
    if commit is None:
        ended_fence(lease.fence, "lease_lost")


def ended(commit: Commit, result: object) -> None:
    """``commit`` was written and answered ``result`` (a ``CasResult``; None: never written):
    its step's span ends with the outcome."""
    if not _open:
        return
    name = getattr(result, "value", result)
    if name == "ok":
        outcome = OUTCOMES.get(commit.kind, commit.kind)
    else:
        outcome = "unwritten" if name is None else str(name)
    error = commit.error if commit.kind in ("release", "fail") else None
    ended_fence(commit.lease.fence, outcome, commit.kind, error)


def ended_fence(
    fence: tuple[int, str, int], outcome: str, kind: str | None = None, error: str | None = None
) -> None:
    span = _open.pop(fence, None)
    if span is None:
        return
    span.set_attribute("leasekeeper.outcome", outcome)
    if kind is not None:
        span.set_attribute("leasekeeper.commit", kind)
    if error or outcome in ("failed", "lease_lost", "unwritten"):
        description = (error or outcome).splitlines()[0][:200]
        trace = _trace()
        span.set_status(trace.Status(trace.StatusCode.ERROR, description))
    span.end()


def configure() -> bool:
    """In a worker process (after fork, never before): a ``TracerProvider`` from the ``OTEL_*``
    environment, when ``OTEL_TRACES_EXPORTER`` (or an ``OTEL_EXPORTER_OTLP_*`` endpoint) names
    an exporter and the SDK is installed. Resource, sampler and batching read their own
    ``OTEL_*`` variables (the SDK's). True when one was set up."""
    global _provider
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names and any(k.startswith("OTEL_EXPORTER_OTLP_") for k in os.environ):
        names = "otlp"
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if disabled or not names or names == "none":
        return False
    try:
        from opentelemetry import trace  # noqa: PLC0415 - only when traces are exported
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError:
        return False
    provider = TracerProvider()  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER
    import importlib.metadata  # noqa: PLC0415 - only when traces are exported

    found = importlib.metadata.entry_points(group="opentelemetry_traces_exporter")
    for name in (n.strip() for n in names.split(",") if n.strip() and n.strip() != "none"):
        points = [p for p in found if p.name == name]
        try:
            exporter = points[0].load()()  # each exporter reads its own OTEL_EXPORTER_* variables
        except Exception as exc:  # a missing or broken exporter: traces off, the worker runs
            log.warning("OTEL_TRACES_EXPORTER: cannot use exporter %r: %s", name,
                        "not installed" if not points else exc)  # fmt: skip
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    return True


def shutdown() -> None:
    """Flush and stop what ``configure`` set up (a worker about to exit)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None
