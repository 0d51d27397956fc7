"""What paid calls are (docs/protocol.md B13), on every backend: which call
(``CallKey``), what its intent found (``CallStart``), its kept answer (``KeptCall``), and what
``show``, the timeline, metrics and ``spend`` read of them; the protocol is
``protocol/calls.py``."""

from __future__ import annotations

from typing import Literal

from .codec import MAX_PAYLOAD
from .records import record
from .types import JSON, Lease, Usage

MAX_RESULT = MAX_PAYLOAD  # a kept answer is at most what a payload may be
MAX_COST = 1e12  # a cost, in the user's own unit
PARKED = "outcome_unknown"  # what a parked run waits for: ``outcome_unknown:NAME``

Unknown = Literal["pay", "park"]  # what ``once`` does after an intent without an answer
UNKNOWN_MODES: tuple[Unknown, ...] = ("pay", "park")


def parked_on(name: str) -> str:
    """What a run parked on call ``name`` waits for."""
    return f"{PARKED}:{name}"


@record
class CallKey:
    """Which call: this run's step (its task), the call's name and its request's hash."""

    run_id: int
    task_id: int
    name: str
    request_hash: str

    def params(self) -> dict[str, object]:
        return {"run_id": self.run_id, "task_id": self.task_id, "name": self.name,
                "request_hash": self.request_hash}  # fmt: skip


@record
class CallStart:
    """What ``begin_call`` found for a call about to be made: ``reused`` (an answer is kept:
    ``kept`` is it, the reuse counted), ``call`` (an intent was written, ``intent`` its id;
    ``again``: an earlier intent of the same call came first, so this is a payment again),
    ``park`` (an earlier intent has no answer and the caller parks: nothing written),
    ``lost`` (this attempt no longer holds a live lease: nothing written, no call may begin)
    or ``over`` (the lease is live but its run is over: cancelled)."""

    outcome: Literal["reused", "call", "park", "lost", "over"]
    kept: KeptCall | None = None
    intent: int | None = None
    again: bool = False
    left: float | None = None  # call: the seconds the lease had left when the intent was written


@record
class Resolved:
    """What ``resolve`` did: ``kept`` the answer given (False: one was kept already, the
    first kept answer wins), ``settled`` intents without an answer, ``resumed`` a run parked
    on the call (its step is due now)."""

    kept: bool
    settled: int
    resumed: bool


@record
class KeptCall:
    """A kept answer: what it was, which attempt paid for it and its tokens. ``outcome``:
    ``reused`` (found), ``kept`` (this answer is the one stored), ``lost_race`` (another was
    kept first: this is that one, ours counted as paid, unused), ``refused`` (not kept: the
    step moved on without this attempt) or ``ended`` (not kept: this attempt's lease is live
    but its run is over); then ``result`` is the caller's own, which ``once`` never returns."""

    result: JSON
    attempt: int
    tokens: int | None
    outcome: Literal["reused", "kept", "lost_race", "refused", "ended"]


@record
class PaidCall:
    """One call of a run as ``show`` lists it: ``started`` times it was made (an intent each),
    ``paid_again`` of them after an earlier one, ``unknown`` of them ended without an answer;
    its kept answer's attempt, owner and tokens (``attempt`` 0: none kept yet); ``unused``
    answers were paid for and thrown away; ``reused`` times it saved a call."""

    task_id: int
    name: str
    request_hash: str
    attempt: int
    owner: str
    tokens: int | None
    at: float
    reused: int
    unused: int
    unused_tokens: int
    started: int = 0
    paid_again: int = 0
    unknown: int = 0

    @property
    def kept(self) -> bool:
        return self.attempt > 0

    @property
    def outcome(self) -> str:
        """What it cost, for people: paid once or more (an upper bound: an intent whose
        answer never came may not have been paid), reused how often, unknown outcomes."""
        paid = max(self.started, (1 if self.kept else 0) + self.unused)
        words = [f"paid {paid}x" if paid > 1 else "paid once" if paid else "not paid"]
        if not self.kept:
            words.append("no answer kept")
        if self.unknown:
            words.append(f"{self.unknown} unknown")
        if self.reused:
            words.append(f"reused {self.reused}x")
        return ", ".join(words)


@record
class CallIntent:
    """One call as it was made (the run's timeline): which step, attempt and worker, whether
    it was a payment again, when it began and when its answer reached the database (None:
    never, or not yet: ``unknown`` says the attempt ended without one), and an operator's
    ``settled`` (``answer``, ``pay_again``)."""

    task_id: int
    name: str
    request_hash: str
    attempt: int
    owner: str
    again: bool
    at: float
    answered_at: float | None
    settled: str | None
    unknown: bool


@record
class Spend:
    """What was kept of usage for one task or payload value: ``entries`` rows (``calls`` of
    them paid calls' own), their tokens and cost (None: no cost was reported)."""

    key: str | None
    entries: int
    calls: int
    tokens: int
    cost: float | None


@record
class CallTotals:
    """Every call's numbers: ``started`` calls made (intents), ``calls`` answers kept,
    ``reused``, ``paid_again`` (an intent after an earlier intent of the same call: an upper
    bound of real second payments), ``unknown`` (an intent whose attempt ended without an
    answer); ``saved_tokens`` are the tokens of reused calls."""

    calls: int = 0
    reused: int = 0
    unused: int = 0
    tokens: int = 0
    saved_tokens: int = 0
    unused_tokens: int = 0
    started: int = 0
    paid_again: int = 0
    unknown: int = 0

    @property
    def kept(self) -> int:
        return self.calls


def usage_row(lease: Lease, name: str | None, usage: Usage, now: float | None) -> dict[str, object]:
    """A row of ``usage``: what ``lease``'s attempt used, of paid call ``name`` (None: its
    ``ctx.usage``)."""
    return {"run_id": lease.run_id, "task_id": lease.task_id, "task": lease.task,
            "attempt": lease.attempt, "name": name, "tokens": usage.tokens, "cost": usage.cost,
            "now": now}  # fmt: skip


@record
class KeepItem:
    """One item of a batch's ``keep_calls``: its lease, its call's key, its answer and the
    intent it answers."""

    lease: Lease
    key: CallKey
    result: JSON
    intent: int | None
