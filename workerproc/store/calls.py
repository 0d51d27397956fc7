"""What paid calls are (issue 27, docs/protocol.md B13), on every backend: which call
(``CallKey``), its kept answer (``KeptCall``), and what ``show`` and metrics read of them; the
protocol is ``protocol/calls.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .codec import MAX_PAYLOAD
from .types import JSON

MAX_RESULT = MAX_PAYLOAD  # a kept answer is at most what a payload may be


@dataclass(frozen=True)
class CallKey:
    """Which call: this run's step (its task), the call's name and its request's hash."""

    run_id: int
    task_id: int
    name: str
    request_hash: str

    def params(self) -> dict[str, object]:
        return {"run_id": self.run_id, "task_id": self.task_id, "name": self.name,
                "request_hash": self.request_hash}  # fmt: skip


@dataclass(frozen=True)
class KeptCall:
    """A kept answer: what it was, which attempt paid for it and its tokens. ``outcome``:
    ``reused`` (found), ``kept`` (this answer is the one stored), ``lost_race`` (another was
    kept first: this is that one, ours counted as paid, unused) or ``refused`` (not kept: the
    run is over or its step done; ``result`` is the caller's own)."""

    result: JSON
    attempt: int
    tokens: int | None
    outcome: Literal["reused", "kept", "lost_race", "refused", "failed"]  # failed: not kept


@dataclass(frozen=True)
class PaidCall:
    """One kept call as ``show`` lists it: ``unused`` answers were paid for and thrown away
    (the call was paid ``1 + unused`` times); ``reused`` times it saved a call."""

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

    @property
    def outcome(self) -> str:
        """What it cost, for people: paid once or twice (and more), reused how often."""
        words = [f"paid {1 + self.unused}x" if self.unused else "paid once"]
        if self.reused:
            words.append(f"reused {self.reused}x")
        return ", ".join(words)


@dataclass(frozen=True)
class CallTotals:
    """Every kept call's numbers: ``saved_tokens`` are the tokens of reused calls."""

    calls: int = 0
    reused: int = 0
    unused: int = 0
    tokens: int = 0
    saved_tokens: int = 0
    unused_tokens: int = 0
