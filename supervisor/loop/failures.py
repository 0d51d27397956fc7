"""``--drain``'s count of the runs that failed while it ran, and ``--fail-on-failed``.

The drain notes the database's clock before the first worker is forked (``drain_began``); its
last line counts the runs of its queues that failed since then and are failed still
(``failed_in_drain``), and with ``--fail-on-failed`` a drain that finished with any exits 16
(``exit_code``); one stopped before it finished (TERM) keeps its exit code. A run that failed
before the drain, or that failed and was retried and succeeded during it, is not one of them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from workerproc.store import Inspector
from workerproc.store.webhooks import WEBHOOK_QUEUE

from .. import exitcodes
from ..logs import event

if TYPE_CHECKING:
    from .arbiter import Arbiter


def drain_began(arb: Arbiter) -> None:
    """Note the database's "now" as the drain's start (before any worker runs)."""
    if not arb.config.drain:
        return
    with arb.gate.session() as store:
        arb.drain_since = store.now()


def failed_in_drain(arb: Arbiter, store: Inspector) -> int:
    """The runs of the served queues (never the webhooks' own) that failed during the drain;
    kept on the arbiter for the exit code."""
    if arb.drain_since is None:
        return 0
    served = arb.config.worker.queues
    mine = [n for queue, n in store.failed_since(arb.drain_since).items()
            if queue != WEBHOOK_QUEUE and (served is None or queue in served)]  # fmt: skip
    arb.drain_failed = sum(mine)
    return arb.drain_failed


def exit_code(arb: Arbiter, code: int) -> int:
    """``--fail-on-failed``: a drain that finished (its last check counted the runs that failed
    in it) exits 16 when a run failed in it. A drain stopped before it finished (TERM) is not
    judged: it keeps its exit code, and says so."""
    if not arb.config.fail_on_failed or code != exitcodes.OK:
        return code
    failed = arb.drain_failed
    if failed is None:
        event("drain_unfinished", "the drain was stopped before it finished: "
              "--fail-on-failed judges a finished drain only", level=logging.WARNING)  # fmt: skip
        return code
    if not failed:
        return code
    event("runs_failed",
          f"{failed} run{'s' if failed != 1 else ''} failed during the drain: exiting "
          f"{exitcodes.RUNS_FAILED} (--fail-on-failed)", level=logging.WARNING,
          failed=failed)  # fmt: skip
    return exitcodes.RUNS_FAILED
