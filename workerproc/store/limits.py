"""Flow control's values, with no SQL: a limit's numbers (``LimitSpec``), the gate a
task waits behind for each of its limits, and the buckets' arithmetic. The protocol
(``protocol/gates.py``) keeps them in the database and decides in the claim.

A **limit** has a name and any of: a rate (starts per second, with a ``burst``), a concurrency
cap (live leases at once), a token budget (tokens per second, with a ``token_burst``), and a
``per`` field: then it is one budget per value of ``payload[per]`` (a tenant, say). A **gate**
is one budget: ``name`` for a limit without ``per``, ``name`` and the payload's value for one
with it (``gate_of``). A task declares at most ``MAX_LIMITS`` limits; its **line** is the gate it
queues behind (its first limit with ``per``, else its first), where claims take runs round-robin
across keys. ``GateState`` is one gate as a claim sees it, and what the claim admits through it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .codec import DECLARED_NAME, check_declared_name
from .errors import InvalidPayload
from .records import record

MAX_LIMITS = 3  # limits per task (a task's gates are three columns: indexed, never parsed)
MAX_KEY = 200  # characters of a ``per`` key
SEP = "\x1f"  # between a limit's name and its key, in a gate's name
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*)\s*(s|sec|m|min|h|hour|d|day)\s*$")
NUMBERS = ("rate", "burst", "concurrency", "tokens", "token_burst")
MAX_NUMBER = 1e9


def per_second(text: str | float | int, what: str) -> float:
    """``"500/m"`` -> 8.333 per second; a bare number is per second. ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"{what} must be a rate like '500/m' (got {text!r})")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _RATE.match(str(text))
        if not m:
            raise ValueError(f"{what} must be a rate like '500/m', '10/s' or '2/5m' (got {text!r})")
        count, span, unit = float(m[1]), float(m[2] or 1), UNITS[m[3][0]]
        value = count / (span * unit) if span else math.nan
    if not 0 < value <= MAX_NUMBER:
        raise ValueError(f"{what} must be above 0 and at most {MAX_NUMBER:g} a second")
    return value


def check_limit_name(name: object) -> str:
    return check_declared_name(name, "a limit")


@record
class LimitSpec:
    """One limit's numbers, all optional (None: that dimension is not limited)."""

    name: str
    rate: float | None = None  # starts per second
    burst: float | None = None  # starts at once after a quiet spell (rate's bucket size)
    concurrency: int | None = None  # live leases at once
    tokens: float | None = None  # tokens per second
    token_burst: float | None = None  # the token bucket's size
    per: str | None = None  # one budget per value of this payload field

    @classmethod
    def declare(
        cls, name: str, *, rate: str | float | None = None, burst: float | None = None,
        concurrency: int | None = None, tokens: str | float | None = None,
        token_burst: float | None = None, per: str | None = None,
    ) -> LimitSpec:  # fmt: skip
        """``app.limit(...)``'s values, checked (ValueError names the bad one). A rate's burst
        defaults to one second of it (at least 1); a token budget's to one minute of it."""
        check_limit_name(name)
        r = None if rate is None else per_second(rate, f"limit {name!r}: rate")
        t = None if tokens is None else per_second(tokens, f"limit {name!r}: tokens")
        if r is None and burst is not None:
            raise ValueError(f"limit {name!r}: burst needs a rate")
        if t is None and token_burst is not None:
            raise ValueError(f"limit {name!r}: token_burst needs tokens")
        for label, value in (("burst", burst), ("token_burst", token_burst)):
            if value is not None and (isinstance(value, bool) or not 1 <= value <= MAX_NUMBER):
                raise ValueError(f"limit {name!r}: {label} must be from 1 to {MAX_NUMBER:g}")
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int)
            or not 1 <= concurrency <= 1_000_000
        ):  # fmt: skip
            raise ValueError(f"limit {name!r}: concurrency must be a whole number from 1")
        if per is not None and (not isinstance(per, str) or not DECLARED_NAME.match(per)):
            raise ValueError(f"limit {name!r}: per must name a payload field (got {per!r})")
        if r is None and concurrency is None and t is None:
            raise ValueError(f"limit {name!r} limits nothing: give rate, concurrency or tokens")
        return cls(
            name, r, None if r is None else float(burst or max(1.0, math.ceil(r))),
            concurrency, t, None if t is None else float(token_burst or t * 60), per,
        )  # fmt: skip

    @property
    def numbers(self) -> dict[str, Any]:
        """The numbers given (not None), by name: what the database keeps as declared."""
        return {k: getattr(self, k) for k in NUMBERS if getattr(self, k) is not None}

    def with_numbers(self, numbers: Mapping[str, Any]) -> LimitSpec:
        values = {k: numbers.get(k) for k in NUMBERS}
        return LimitSpec(self.name, per=self.per, **values)


class LimitKey(NamedTuple):
    """One key of a limit (``""``: a limit without ``per``) now: its live leases, the runs
    waiting behind it, its pause, and its buckets' levels (None: not limited that way)."""

    key: str
    live: int
    waiting: int
    paused_until: float | None
    level: float | None = None  # starts the rate bucket holds now
    tokens_left: float | None = None  # tokens the token bucket holds now


@record
class LimitInfo:
    """One limit as operators see it: its numbers now, what was declared and set, its use now
    (live leases, runs waiting behind it, tokens charged) and its busiest ``keys``. ``level``
    and ``tokens_left``: its buckets now, for a limit without ``per`` (one per key otherwise)."""

    name: str
    spec: LimitSpec
    declared: dict[str, Any]
    declared_by: str
    overrides: dict[str, Any] | None
    in_use: int
    waiting: int
    used_tokens: int
    keys: list[LimitKey]
    level: float | None = None
    tokens_left: float | None = None


def gate_of(spec_name: str, per: str | None, payload: Any) -> str:
    """The gate a task with this payload waits behind for limit ``spec_name`` (``per``: its
    payload field; a run without that field, or with one no string can stand for, shares
    the limit's ``""`` key)."""
    if per is None:
        return spec_name
    value = payload.get(per) if isinstance(payload, dict) else None
    if value is None or isinstance(value, (dict, list)):
        key = ""
    else:
        key = value if isinstance(value, str) else str(value)
    if len(key) > MAX_KEY or "\x00" in key or SEP in key:
        raise InvalidPayload(
            f"payload[{per!r}] (limit {spec_name!r}'s key) must be a string of at most "
            f"{MAX_KEY} characters without NUL (got {key[:40]!r})"
        )
    return f"{spec_name}{SEP}{key}"


def split_gate(gate: str) -> tuple[str, str]:
    """A gate's limit name and key (``""`` for a limit without ``per``)."""
    name, _, key = gate.partition(SEP)
    return name, key


@record
class Gating:
    """What a task's limits make of one run of it: its gates, its line, its token reservation."""

    gates: tuple[str, ...] = ()
    line: str | None = None
    tokens: int | None = None

    def params(self) -> dict[str, Any]:
        """The columns a task row keeps of it (``line``, ``gate_a``..``gate_c``, ``tokens``)."""
        line, a, b, c, tokens = self.columns()
        return {"line": line, "gate_a": a, "gate_b": b, "gate_c": c, "tokens": tokens}

    def columns(self) -> tuple[str | None, str | None, str | None, str | None, int | None]:
        """``params``' values in that order."""
        a, b, c = (*self.gates, None, None, None)[:MAX_LIMITS]
        return self.line, a, b, c, self.tokens


UNGATED = Gating()


def gating(
    limits: Sequence[str], specs: Mapping[str, LimitSpec], tokens: int | None, payload: Any
) -> Gating:
    """The gates of a run of a task declared with ``limits`` (a limit the database does not
    know is left out: the task runs as if it had none of it)."""
    known = [specs[name] for name in limits if name in specs]
    if not known:
        return UNGATED
    gates = tuple(gate_of(s.name, s.per, payload) for s in known)
    keyed = [g for g, s in zip(gates, known, strict=True) if s.per is not None]
    budgeted = any(s.tokens is not None for s in known)
    return Gating(gates, (keyed or list(gates))[0], (tokens or 0) if budgeted else None)


TOO_LARGE = "reservation_too_large"  # the failure reason of a run no bucket can ever admit


def never_fits(tokens: int | None, spec: LimitSpec | GateState) -> bool:
    """Whether a reservation of ``tokens`` exceeds what the token bucket of ``spec`` ever
    holds (its ``token_burst``): a run reserving it could never be admitted through it."""
    burst = spec.token_burst if spec.tokens is not None else None
    return bool(tokens) and burst is not None and tokens is not None and tokens > burst


def too_large(task: str, tokens: int, limit: str, burst: float) -> str:
    """The one line that says why a reservation can never fit (``never_fits``)."""
    return (f"task {task!r} reserves {tokens} tokens, more than limit {limit!r} ever holds "
            f"(token_burst {burst:g}): lower the task's tokens= or raise the limit's "
            "token_burst")  # fmt: skip


def unfit(
    tasks: Mapping[str, tuple[Sequence[str], int | None]], specs: Mapping[str, LimitSpec]
) -> list[str]:
    """``too_large``'s line for every task (its limits and reservation, by name) whose
    reservation one of its limits in ``specs`` can never admit."""
    return [too_large(task, tokens or 0, name, specs[name].token_burst or 0)
            for task, (limits, tokens) in sorted(tasks.items()) for name in limits
            if name in specs and never_fits(tokens, specs[name])]  # fmt: skip


def refill(level: float | None, at: float | None, rate: float, size: float, now: float) -> float:
    """A bucket's level at ``now``: full when never used, else what it held plus what ``rate``
    added since ``at``, at most ``size``."""
    if level is None or at is None:
        return size
    return min(size, level + max(0.0, now - at) * rate)


def when_level(level: float, need: float, rate: float, now: float) -> float:
    """When a bucket that holds ``level`` now will hold ``need`` at ``rate``."""
    return now if level >= need else now + (need - level) / rate


@dataclass
class GateState:
    """One gate as a claim sees it, locked: its numbers, its buckets now, its live leases."""

    gate: str
    rate: float | None
    burst: float | None
    concurrency: int | None
    tokens: float | None
    token_burst: float | None
    level: float | None
    level_at: float | None
    tok_level: float | None
    tok_at: float | None
    paused_until: float
    live: int
    first_expiry: float | None  # the earliest end of a live lease holding one of its slots
    starts: int = 0  # admitted by this claim
    dirty: bool = False
    ready_at: float | None = field(default=None)  # what to write back (with ``decided``)
    blocked_by: str | None = None  # the gate of another limit that keeps this line closed
    decided: bool = False
    idle: bool = False  # closed only until its line's next due run (a sooner one opens it)
    served: bool = False  # its line admitted a run in this claim: its turn moves to the back

    @classmethod
    def of(cls, row: tuple[Any, ...]) -> GateState:
        return cls(*row)

    def now_levels(self, now: float) -> tuple[float, float]:
        rate = math.inf
        if self.rate is not None and self.burst is not None:
            rate = refill(self.level, self.level_at, self.rate, self.burst, now)
        toks = math.inf
        if self.tokens is not None and self.token_burst is not None:
            toks = refill(self.tok_level, self.tok_at, self.tokens, self.token_burst, now)
        return rate, toks

    def admits(self, now: float, need: int) -> bool:
        rate, toks = self.now_levels(now)
        full = self.concurrency is not None and self.live >= self.concurrency
        return self.paused_until <= now and not full and rate >= 1 and toks >= need

    def room(self, now: float) -> int:
        """Starts this gate alone allows now (a token reservation is judged per run)."""
        if self.paused_until > now:
            return 0
        rate, _ = self.now_levels(now)
        slots = math.inf if self.concurrency is None else self.concurrency - self.live
        return max(0, int(min(slots, rate, 1_000_000)))

    def admit(self, now: float, need: int, until: float) -> None:
        """One more run admitted, its lease holding a slot ``until`` (at the latest)."""
        rate, toks = self.now_levels(now)
        self.first_expiry = until if self.first_expiry is None else min(self.first_expiry, until)
        if self.rate is not None:
            self.level, self.level_at = rate - 1, now
        if self.tokens is not None:
            self.tok_level, self.tok_at = toks - need, now
        self.live += 1
        self.starts += 1
        self.dirty = True

    def give_back(self, now: float, tokens: int) -> None:
        """A reservation returns (a takeover's predecessor, a claim undone)."""
        if self.tokens is not None and self.token_burst is not None and tokens:
            _, toks = self.now_levels(now)
            self.tok_level, self.tok_at = min(self.token_burst, toks + tokens), now
            self.dirty = True

    def next_open(self, now: float, need: int) -> float | None:
        """When this gate may have room for a run that reserves ``need`` tokens."""
        rate, toks = self.now_levels(now)
        at = max(now, self.paused_until)
        if self.rate is not None and rate < 1:
            at = max(at, when_level(rate, 1, self.rate, now))
        if self.tokens is not None and toks < need:
            refilled = when_level(toks, need, self.tokens, now)
            # a lease that expires gives its reservation back when it is taken over: look
            # again then, if that comes first
            at = max(at, min(refilled, self.first_expiry or refilled))
        if self.concurrency is not None and self.live >= self.concurrency:
            if self.first_expiry is None:
                return None  # only a lease that ends frees a slot, and that reopens the gate
            at = max(at, self.first_expiry)
        return at

    def decide(
        self, ready_at: float | None, blocked_by: str | None = None, *, idle: bool = False
    ) -> None:
        """When its line may next admit a run: ``ready_at`` (None: nothing waits); ``idle``:
        it has room, only none of its runs is due before then."""
        self.ready_at, self.blocked_by, self.idle = ready_at, blocked_by, idle
        self.decided = self.dirty = True

    def params(self, now: float) -> dict[str, Any]:
        return {"gate": self.gate, "level": self.level, "level_at": self.level_at,
                "tok_level": self.tok_level, "tok_at": self.tok_at, "starts": self.starts,
                "ready_at": self.ready_at if self.decided else now,
                "blocked_by": self.blocked_by, "idle": self.idle, "keep": not self.decided,
                "turn": now if self.served else None,
                "now": now}  # fmt: skip


# what ``GATE_WRITE`` writes of a gate
WRITTEN = ("gate", "level", "level_at", "tok_level", "tok_at", "starts", "ready_at",
           "blocked_by", "idle", "keep", "turn")  # fmt: skip


def gate_writes(states: Sequence[GateState], now: float) -> dict[str, Any]:
    """``GATE_WRITE``'s parameters for ``states``: one list per column of ``WRITTEN``, a
    gate's values at its index (one statement writes them all)."""
    rows = [state.params(now) for state in states]
    return {**{column: [row[column] for row in rows] for column in WRITTEN}, "now": now}
