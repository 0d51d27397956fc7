"""The W3C ``traceparent`` of the caller's span, stored with each run a producer starts.

The store owns this one reader of the trace context so that it depends on nothing of the worker;
``workerproc.tracing`` (the worker's spans) imports it from here. Without OpenTelemetry (the
optional ``otel`` extra) loaded by the caller it is a cheap no-op that answers None.
"""

from __future__ import annotations

import sys


def current_traceparent() -> str | None:
    """The caller's current span as a W3C ``traceparent``, when one is recording. A caller
    with a span has imported OpenTelemetry already: when no one has, there is none to read,
    and the store never imports it itself (a CLI call does not pay for it)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if not span.is_recording() or not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
