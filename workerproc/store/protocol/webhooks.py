"""Webhooks kept in the database (docs/protocol.md B20), written once.

Adding a webhook is ONE write transaction: its row (its position N: it delivers the events
after N) and its delivery run (task ``DELIVERY_TASK`` on ``WEBHOOK_QUEUE``), a system run,
numbered from ``SYSTEM_RUNS`` up. Removing one deletes the row and cancels the run in one
transaction: a delivery in flight finds its next write refused (the run is over) and moves
nothing. Everything a delivery does after that is under its lease's fence: each acknowledged
POST moves the position (``move_webhook``, one small row), and its end commits the run's state
(the failures, the last error, the dead letters) (``workerproc.delivery``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..dialect import Dialect, Row, Tx
from ..errors import InvalidOption, RunNotFound
from ..newrun import NewRun
from ..redaction import redact, redact_url
from ..types import Lease, Run, TaskOptions
from ..webhooks import (
    BACKLOG_MAX,
    DELIVERY_TASK,
    MAX_DEAD,
    MAX_WEBHOOKS,
    WAKE_SIGNAL,
    WEBHOOK_QUEUE,
    DeadLetter,
    RetryNumbers,
    Webhook,
    WebhookInfo,
    check_kinds,
    check_secret,
    check_url,
    check_webhook_name,
    count_in,
    kinds_of,
    kinds_text,
    standing,
)
from .commits import fence, held
from .events import KINDS, check_position, not_past_newest, sequencing
from .operators import cancel
from .producers import insert
from .programs import drive
from .waits import send, signal_ask

# the delivery task's options, declared by ``add_webhook``: a delivery
# that crashes or is killed is tried again for as long as it takes (its run failing would stop
# the webhook), on its own queue
DELIVERY_OPTIONS = TaskOptions(max_attempts=1000, queue=WEBHOOK_QUEUE, timeout=600.0)
PARKED = f"signal:{WAKE_SIGNAL}"  # a parked delivery run's wait


def _webhook(row: Row) -> Webhook:
    name, url, kinds, secret, run_id, max_failures, backoff, backoff_max, timeout, at = row[:10]
    position, delivered, delivered_at, in_flight = row[10:14]
    retry = RetryNumbers(int(max_failures), float(backoff), float(backoff_max), float(timeout),
                         int(in_flight))  # fmt: skip
    return Webhook(name, url, kinds_of(kinds), int(run_id), float(at), retry, secret,
                   int(position), int(delivered),
                   None if delivered_at is None else float(delivered_at))  # fmt: skip


def info(
    hook: Webhook, run: Run | None, backlog: int = 0, due: float | None = None,
    in_flight: bool = False,
) -> WebhookInfo:  # fmt: skip
    """A webhook with its position, its backlog (``backlog``) and its delivery run's record (the
    run's state as its last commit left it; ``due``: when its next task is; ``in_flight``: a
    delivery holds its lease, or held it until it expired)."""
    state: dict[str, Any] = run.state if run is not None and isinstance(run.state, dict) else {}
    kept = [d for d in state.get("dead", ()) if isinstance(d, dict) and type(d.get("event")) is int]
    dead = tuple(
        DeadLetter(int(d["event"]), d.get("run_id"), str(d.get("kind")),
                   redact(str(d.get("error"))), float(d.get("at", 0)))
        for d in kept[-MAX_DEAD:]
    )  # fmt: skip
    if run is None:
        status = "missing"
    elif run.waiting_for is not None and not run.terminal:
        status = "waiting"
    else:
        status = run.status
    error = state.get("last_error")
    cursor, failures = standing(hook.position, state)
    return WebhookInfo(  # as people and scripts see it: no secret of its URL (a ?token=...)
        hook.name, redact_url(hook.url), hook.kinds, hook.run_id, hook.created_at, hook.retry,
        status, cursor, hook.delivered, failures, redact(error) if isinstance(error, str) else None,
        hook.delivered_at, count_in(state, "dead_total"), dead, backlog,
        due if failures and status == "pending" else None, in_flight,
    )  # fmt: skip


class Webhooks:
    dialect: Dialect
    if TYPE_CHECKING:

        def get_run(self, run_id: int) -> Run | None: ...  # ``Reads``
        def last_event_id(self) -> int: ...  # ``Events``
        def register_tasks(self, declared: dict[str, TaskOptions]) -> int: ...  # ``Tasks``

    def add_webhook(
        self, name: str, url: str, *, secret: str, kinds: Sequence[str] | None = None,
        after: int | None = None, retry: RetryNumbers | None = None,
    ) -> Webhook:  # fmt: skip
        """Add webhook ``name``: every event after id ``after`` (None: the newest now, so
        only events from now on) whose kind ``kinds`` names (None: all; ``run.*``: a family)
        is POSTed to ``url``, signed with ``secret`` (``workerproc.webhooks``), at least once
        and in order. ``InvalidOption`` for a bad value (``after`` above the newest event
        included) or a name already taken."""
        name = check_webhook_name(name)
        url = check_url(url)
        secret = check_secret(secret)
        chosen = check_kinds(kinds, KINDS)
        retry = retry or RetryNumbers()
        start = self.last_event_id() if after is None else check_position(after, "after")
        self.register_tasks({DELIVERY_TASK: DELIVERY_OPTIONS})
        # a system run: numbered apart (no user id taken), on leasekeeper's own queue
        run = NewRun.make(DELIVERY_TASK, {"webhook": name}, {}, 0, None, WEBHOOK_QUEUE, 0,
                          traceparent="", system=True)  # fmt: skip

        ordered = self.dialect.ordered_events

        def write(tx: Tx) -> Webhook:
            if after is not None:  # (a position past the newest would skip events for ever)
                drive(not_past_newest(start, ordered, "after"), tx)
            held = tx.rows("WEBHOOK_ROWS", {})
            if any(row[0] == name for row in held):
                raise InvalidOption(f"webhook {name!r} exists (supervisor webhooks remove {name})")
            if len(held) >= MAX_WEBHOOKS:
                raise InvalidOption(f"a database holds at most {MAX_WEBHOOKS} webhooks")
            (run_id,) = insert(tx, [run])
            params = {
                "name": name, "url": url, "kinds": kinds_text(chosen), "secret": secret,
                "run_id": run_id, "max_failures": retry.max_failures, "backoff": retry.backoff,
                "backoff_max": retry.backoff_max, "timeout": retry.timeout, "now": tx.now,
                "position": start, "in_flight": retry.in_flight,
            }  # fmt: skip
            if tx.one("WEBHOOK_ADD", params) is None:  # added meanwhile (another host)
                raise InvalidOption(f"webhook {name!r} exists (supervisor webhooks remove {name})")
            return Webhook(name, url, chosen, run_id, float(tx.time()), retry, secret, start)

        return self.dialect.write(write, intent="start")

    def remove_webhook(self, name: str) -> bool:
        """Remove webhook ``name`` and cancel its delivery run (one transaction); False when
        there is none. A delivery in flight delivers at most what it had begun."""
        params = {"name": check_webhook_name(name)}

        def write(tx: Tx) -> bool:
            row = tx.one("WEBHOOK_DROP", params)
            if row is None:
                return False
            with contextlib.suppress(RunNotFound):  # its run was pruned: nothing to cancel
                cancel(tx, int(row[0]))
            return True

        return self.dialect.write(write)

    def wake_webhook(self, run_id: int) -> bool:
        """Signal delivery run ``run_id`` if it is parked now (one transaction, the run held
        first: two wakers of the same run signal it once); False when it was not parked."""
        ask = signal_ask(run_id, WAKE_SIGNAL, None)

        def write(tx: Tx) -> bool:
            row = tx.one("WEBHOOK_PARKED", {"run_id": run_id})
            if row is None or row[0] != PARKED:
                return False
            tx.count("WEBHOOK_SIGNALS_DONE", {"run_id": run_id})  # the wakes before: spent
            send(tx, ask)
            return True

        return self.dialect.write(write, runs=[run_id])

    def move_webhook(self, lease: Lease, position: int, delivered: int = 0) -> bool:
        """The delivery holding ``lease`` (its webhook's delivery run's) has dealt with every
        event up to ``position``, ``delivered`` of them POSTed and acknowledged: its webhook's
        position moves there (never back) and the count on, in one small fenced write (R2).
        One statement that may run on its own (on PostgreSQL: no BEGIN, no COMMIT round trip),
        idempotent (a count moves only with the position), so a lost connection may send it
        again. False when nothing moved: the fence refused it (a zombie: recorded, in a
        transaction of its own), or the webhook is gone."""
        params = {"position": check_position(position, "position"), "delivered": int(delivered)}

        def move(tx: Tx) -> bool:
            return tx.one("WEBHOOK_MOVE", {**params, **fence(lease, tx.now)}) is not None

        def refused(tx: Tx) -> None:
            held(tx, lease, "webhook_move")  # a lost lease recorded (else the webhook is gone)

        if self.dialect.write(move, intent="statement"):
            return True
        self.dialect.write(refused, runs=[lease.run_id])
        return False

    def webhook(self, name: str) -> Webhook | None:
        """Webhook ``name`` as its deliverer reads it (its secret included), or None."""
        params = {"name": check_webhook_name(name)}
        row = self.dialect.read(lambda tx: tx.one("WEBHOOK_ROW", params))
        return None if row is None else _webhook(row)

    def webhook_list(self) -> list[Webhook]:
        """Every webhook (secrets included), by name: what the delivery's waker reads."""
        return [_webhook(row) for row in self.dialect.read(lambda tx: tx.rows("WEBHOOK_ROWS", {}))]

    def webhooks(self) -> list[WebhookInfo]:
        """Every webhook with its delivery record and its backlog, by name (no secret)."""
        hooks = self.webhook_list()
        if hooks and not self.dialect.ordered_events:  # (PostgreSQL: number what committed)
            self.dialect.write(lambda tx: drive(sequencing(), tx))
        found = []
        for hook in hooks:
            run = self.get_run(hook.run_id)
            cursor, _ = standing(hook.position, None if run is None else run.state)
            found.append(info(hook, run, *self._behind(hook, cursor)))
        return found

    def _behind(self, hook: Webhook, after: int) -> tuple[int, float | None, bool]:
        """How many of the users' events after ``after`` ``hook`` wants (up to
        ``BACKLOG_MAX``), when its delivery run's next task is due, and whether a delivery
        is in flight."""
        params = {"after": after, "limit": BACKLOG_MAX, "run_id": hook.run_id}

        def read(tx: Tx) -> tuple[int, float | None, bool]:
            kinds = tx.rows("WEBHOOK_BACKLOG", params)
            due = tx.one("WEBHOOK_DUE", params)
            backlog = sum(int(n) for kind, n in kinds if hook.wants(kind))
            if due is None:  # (its run is gone)
                return backlog, None, False
            return backlog, None if due[0] is None else float(due[0]), bool(due[1])

        return self.dialect.read(read)
