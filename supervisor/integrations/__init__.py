"""Process-manager integrations plugged into the arbiter: sd_notify with its watchdog, and the
Prometheus endpoint. Both are steps and event subscribers; neither adds a thread, and neither
keeps a database connection (they share one cached ``StatsProbe``)."""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping

from ..logs import event
from ..loop.arbiter import Arbiter, Step
from .http import HttpEndpoint, listen
from .notify import SystemdNotify
from .probe import StatsProbe

SERVE_AGAIN = 0.02  # a response that did not fit the socket buffer: try again this soon


def install(
    arb: Arbiter, environ: MutableMapping[str, str] | None = None
) -> list[Callable[[], None]]:
    """Wire what the config and environment ask for; return what a forked worker must close.

    Called before the first fork: the metrics socket is bound (a port in use fails the start).
    """
    env = os.environ if environ is None else environ
    closers: list[Callable[[], None]] = []
    probe = StatsProbe()
    notify = SystemdNotify.from_env(env, probe)
    if notify is not None:
        notify.install(arb)
    port = arb.config.metrics_port
    if port is not None:
        closers.append(_serve_metrics(arb, probe, arb.config.metrics_host, port))
    if notify is not None or port is not None:
        arb.add_step(Step("probe", probe.step), before="publish")
    return closers


def _serve_metrics(arb: Arbiter, probe: StatsProbe, host: str, port: int) -> Callable[[], None]:
    from .metrics import CONTENT_TYPE, Metrics  # noqa: PLC0415 - prometheus-client, when asked

    metrics = Metrics(probe)
    metrics.install(arb)
    endpoint = HttpEndpoint(
        listen(host, port),
        {"/metrics": lambda: (CONTENT_TYPE, metrics.render(arb))},
        arb.inbox.extra_fds,
        clock=arb.clock,
    )

    def serve(a: Arbiter) -> None:
        if endpoint.serve():
            a.wake_at(a.clock() + SERVE_AGAIN)

    arb.add_step(Step("metrics", serve), before="finish")
    bound_host, bound_port = endpoint.address
    event(
        "metrics_listening",
        f"serving Prometheus metrics on http://{_hostport(bound_host, bound_port)}/metrics",
        host=bound_host,
        port=bound_port,
    )
    return endpoint.close_in_child


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
