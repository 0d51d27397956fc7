"""Webhooks (docs/protocol.md B20): what a webhook is, checked before anything
is written.

A webhook is a row (its URL, the event kinds it wants, its secret, its retry numbers, its
position: the last event id it has dealt with) and one long-lived *delivery run* on the reserved
queue ``WEBHOOK_QUEUE``, whose task ``DELIVERY_TASK`` any worker claims under a lease like every
other task. Every write of a delivery is fenced by that lease: the position moves after each
acknowledged POST (``move_webhook``), and the run's state, committed at each execution's end,
keeps the rest of its record (the failures in a row, the last error, the dead letters, and the
``cursor`` it reached: ``standing`` reads the two together). So a zombie's deliveries move
nothing and a takeover starts again from the last position moved: delivery is at least once,
in event order (so in order per run). ``workerproc.delivery`` does the delivering.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Sequence
from dataclasses import field
from typing import Any
from urllib.parse import urlsplit

from .codec import QUEUE_NAME, shown
from .errors import InvalidOption
from .records import record
from .redaction import redact_url
from .types import SYSTEM_RUNS, Event

# the delivery runs' queue (every worker claims it, unless its --queues leaves it out)
WEBHOOK_QUEUE = "leasekeeper.webhooks"
DELIVERY_TASK = "leasekeeper.webhook"  # the delivery runs' one task, built into every worker
WAKE_SIGNAL = "events"  # what a parked delivery run waits for (sent when it has work again)
MAX_URL = 2048
MAX_SECRET = 1024
MAX_WEBHOOKS = 100
MAX_DEAD = 100  # dead letters a webhook's state keeps (the newest; ``dead_total`` counts all)
BACKLOG_MAX = 100_000  # events a backlog counts at most (a bounded read, whatever is behind)
IN_FLIGHT = 8  # a webhook's events open at once unless it says (``RetryNumbers.in_flight``)
MAX_IN_FLIGHT = 64

_KIND = re.compile(r"[a-z_]+\.(\*|[a-z_]+)")


@record
class RetryNumbers:
    """How a webhook retries an event that failed: ``max_failures`` deliveries in a row (1 to
    1000) before it is a dead letter; the delay after a failure doubles from ``backoff`` up to
    ``backoff_max`` seconds (±25 % jitter); each POST takes ``timeout`` seconds at most, in
    all: connecting, sending and the whole answer (``workerproc.posting``); up to ``in_flight``
    (1 to ``MAX_IN_FLIGHT``) of its events are open at once (its delivery's window:
    ``workerproc.window``), which is also the most a fault sends again (1: one POST at a time)."""

    max_failures: int = 20
    backoff: float = 1.0
    backoff_max: float = 600.0
    timeout: float = 10.0
    in_flight: int = IN_FLIGHT

    def __post_init__(self) -> None:
        _ranged(self.max_failures, "max_failures", 1, 1000, integer=True)
        _ranged(self.backoff, "backoff", 0.0, 3600.0)
        _ranged(self.backoff_max, "backoff_max", 0.0, 86_400.0)
        _ranged(self.timeout, "timeout", 0.1, 120.0)
        _ranged(self.in_flight, "in_flight", 1, MAX_IN_FLIGHT, integer=True)
        if self.backoff > self.backoff_max:
            raise InvalidOption("a webhook's backoff must not exceed its backoff_max")


@record
class Webhook:
    """A webhook as the deliverer reads it (its secret included: never shown)."""

    name: str
    url: str
    kinds: tuple[str, ...] | None  # None: every kind; "run.*": every kind of that family
    run_id: int  # its delivery run
    created_at: float
    retry: RetryNumbers = field(default_factory=RetryNumbers)
    secret: str = field(default="", repr=False)
    position: int = 0  # the last event id it has dealt with (moved by ``move_webhook``)
    delivered: int = 0  # POSTs its receiver acknowledged
    delivered_at: float | None = None  # when the last one was

    def wants(self, kind: str) -> bool:
        if self.kinds is None:
            return True
        family = kind.partition(".")[0] + ".*"
        return kind in self.kinds or family in self.kinds

    def takes(self, event: Event) -> bool:
        """Whether it delivers ``event``: a kind it wants, of a user's run (the system's own
        runs' events, the deliveries' claims, parks and wakes, are never delivered: they are
        read past, as the kinds it does not want are, so its position keeps up with them)."""
        return (event.run_id or 0) < SYSTEM_RUNS and self.wants(event.kind)


@record
class DeadLetter:
    """An event a webhook gave up on after ``max_failures`` deliveries."""

    event: int
    run_id: int | None
    kind: str
    error: str
    at: float


@record
class WebhookInfo:
    """A webhook as ``supervisor webhooks`` and the dashboard show it: its numbers, and its
    delivery run's record (from the run's state, as the last fenced commit left it). Its URL
    and errors are shown ones (``redact_url``: a token in the query is masked)."""

    name: str
    url: str
    kinds: tuple[str, ...] | None
    run_id: int
    created_at: float
    retry: RetryNumbers
    status: str  # the delivery run's: pending/running/waiting (parked)/failed/cancelled
    cursor: int  # the last event id it has dealt with (its position)
    delivered: int
    failures: int  # failed deliveries in a row of the event after the cursor
    last_error: str | None
    last_delivery_at: float | None
    dead_total: int
    dead: tuple[DeadLetter, ...]
    backlog: int = 0  # the users' events after the cursor it wants (counted to ``BACKLOG_MAX``)
    next_try_at: float | None = None  # after a failure: when it tries again (backing off)
    in_flight: bool = False  # a delivery holds its lease (or held it until it expired)

    def settled(self) -> bool:
        """Whether it has delivered what it can for now, what ``--drain`` waits for: caught up
        (and no delivery in flight), failing (a failure committed: backing off, or trying the
        event again however soon: a receiver that never answers is not waited out), or
        unable to deliver (its delivery run over, or gone)."""
        if self.status in ("failed", "cancelled", "missing") or self.failures > 0:
            return True
        return self.backlog == 0 and not self.in_flight

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "url": self.url, "kinds": list(self.kinds) if self.kinds else None,
            "run_id": self.run_id, "created_at": self.created_at, "status": self.status,
            "cursor": self.cursor, "delivered": self.delivered, "failures": self.failures,
            "last_error": self.last_error, "last_delivery_at": self.last_delivery_at,
            "max_failures": self.retry.max_failures, "backoff": self.retry.backoff,
            "backoff_max": self.retry.backoff_max, "timeout": self.retry.timeout,
            "window": self.retry.in_flight,
            "dead_total": self.dead_total, "backlog": self.backlog,
            "next_try_at": self.next_try_at, "in_flight": self.in_flight,
            "dead": [vars(d) for d in self.dead],
        }  # fmt: skip


def count_in(state: object, key: str) -> int:
    """A count kept in a delivery run's state (0: none there)."""
    value = state.get(key) if isinstance(state, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def standing(position: int, state: object) -> tuple[int, int]:
    """Where a webhook stands, from its row's ``position`` and its delivery run's ``state`` as
    the last commit left it: the last event it has dealt with (the state's ``cursor`` when that
    is ahead: a dead letter is committed before its position moves) and the failures in a row
    of the event after it. Those count only while the position is not past the cursor they were
    committed at: once it is, that event was delivered since (by an execution whose end was
    never committed), and the next event's failures start from none."""
    cursor = count_in(state, "cursor")
    failures = count_in(state, "failures") if position <= cursor else 0
    return max(position, cursor), failures


def _ranged(value: object, what: str, low: float, high: float, *, integer: bool = False) -> None:
    numeric = isinstance(value, int) or (not integer and isinstance(value, float))
    if isinstance(value, bool) or not numeric or not low <= value <= high:  # type: ignore[operator]
        raise InvalidOption(
            f"a webhook's {what} must be from {low:g} to {high:g} (got {shown(value)})"
        )


def check_webhook_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidOption(
            "a webhook's name must be 1-64 characters of letters, digits and _.:- "
            f"(got {shown(name)})"
        )
    return name


def check_url(url: object) -> str:
    """An http(s) URL with a host, at most ``MAX_URL`` characters, no credentials in it."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL or not url.isprintable():
        raise InvalidOption(
            f"a webhook's URL must be 1-{MAX_URL} printable characters (got {_shown_url(url)})"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as exc:
        raise InvalidOption(f"a webhook's URL cannot be parsed: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidOption(
            f"a webhook's URL must be http:// or https:// with a host (got {_shown_url(url)})"
        )
    if any(c.isspace() for c in url):  # no URL holds one ("http://a b.com/" names no host)
        raise InvalidOption(
            f"a webhook's URL must not contain spaces (write %20 in its path; got "
            f"{_shown_url(url)})"
        )
    if not _host_ok(parts.hostname):
        raise InvalidOption(
            f"a webhook's URL names no valid host: {shown(parts.hostname)} (letters, digits, "
            "'-' and '.', or an IP address)"
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidOption("a webhook's URL must not carry credentials (deliveries are signed)")
    return url


def _shown_url(url: object) -> str:
    """A refused URL in its refusal: its secrets masked, cut short."""
    return shown(redact_url(url) if isinstance(url, str) else url, 80)


def _host_ok(host: str) -> bool:
    """A DNS name (its labels letters, digits, '-' and '_'; letters of any script: an IDN), an
    IPv4 address, or an IPv6 one (``urlsplit`` drops its brackets)."""
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.partition("%")[0])
        except ValueError:
            return False
        return True
    labels = host.removesuffix(".").split(".")
    return all(
        0 < len(label) <= 63 and all(c.isalnum() or c in "-_" for c in label) for label in labels
    )


def check_kinds(kinds: Sequence[str] | None, known: frozenset[str]) -> tuple[str, ...] | None:
    """Event kinds (``run.failed``), or families (``run.*``), each known; None or empty: all."""
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = [k for k in kinds.split(",") if k.strip()]
    families = {k.partition(".")[0] for k in known}
    chosen: list[str] = []
    for given in kinds:
        kind = given.strip() if isinstance(given, str) else given
        if not isinstance(kind, str) or not _KIND.fullmatch(kind):
            raise InvalidOption(
                f"a webhook's kind must look like run.failed or run.* (got {shown(given)})"
            )
        name, _, rest = kind.partition(".")
        if (rest == "*" and name not in families) or (rest != "*" and kind not in known):
            raise InvalidOption(f"unknown event kind {kind!r} (known: {', '.join(sorted(known))})")
        if kind not in chosen:
            chosen.append(kind)
    return tuple(chosen) or None


def check_secret(secret: object) -> str:
    if not isinstance(secret, str) or not secret.strip() or len(secret) > MAX_SECRET:
        raise InvalidOption(f"a webhook's secret must be 1-{MAX_SECRET} characters")
    if not secret.isprintable():
        raise InvalidOption("a webhook's secret must be printable text")
    return secret


def kinds_text(kinds: tuple[str, ...] | None) -> str | None:
    return None if kinds is None else json.dumps(list(kinds))


def kinds_of(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(json.loads(text))
