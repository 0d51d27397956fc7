"""The typed asks and rows of flow control's gate verbs (``driver.py`` re-exports them; kept
apart only to keep each file short): what a transaction's commits give back to a gate
(``GateSettle``), the gates and lines new runs join (``Placing``), a line's first runs
(``LineRun``), and what ``open_gates`` and ``look_gates`` read (``Opened``, ``GateLook``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from .records import record

if TYPE_CHECKING:
    from .dialect import Row


@dataclass
class GateSettle:
    """What a transaction's written commits under gated leases give back to one gate: the
    reserved tokens not used (``back``), those used (``charged``), hand-backs that never
    started (``unstart``: their rate tokens come back too) and a ``RetryAfter``'s pause."""

    gate: str
    back: int = 0
    charged: int = 0
    unstart: int = 0
    pause: float | None = None


@record
class Placing:
    """Gates the transaction's new runs name (each created when new) and the lines they
    joined (each may admit a run now, unless closed for a while)."""

    gates: tuple[str, ...]
    lines: tuple[str, ...]


class LineRun(NamedTuple):
    """One of a line's first claimable runs (``LINE_RUNS``' row, locked): its line, its head
    task, the tokens its claim reserves, what an expired lease on it still holds (a takeover
    gives it back; None: no such lease) and its gates."""

    line: str
    run_id: int
    task_id: int
    reserve: int | None
    before: int | None
    gate_a: str | None
    gate_b: str | None
    gate_c: str | None

    @property
    def gates(self) -> tuple[str, ...]:
        return tuple(g for g in (self.gate_a, self.gate_b, self.gate_c) if g)

    @property
    def need(self) -> int:
        """The tokens its claim takes now (a takeover's predecessor gives its own back)."""
        return max(0, (self.reserve or 0) - (self.before or 0))


@record
class Opened:
    """The gates whose line may admit a run now (``OPEN_GATES``, locked where the engine has
    row locks), the moment the claim stands at (read after their locks), and what was read
    with them of the gates this transaction settled (``held``: their states, their lines'
    first ``limit`` runs, by line)."""

    gates: list[str]
    now: float
    held: list[str] = field(default_factory=list)
    states: list[Row] = field(default_factory=list)
    runs: dict[str, list[LineRun]] = field(default_factory=dict)
    limit: int = 0

    def __bool__(self) -> bool:
        return bool(self.gates)


@record
class GateLook:
    """Gates' states (``GATE_STATE`` rows; a gate without one: another claimer holds it) and
    their lines' first runs, by line."""

    states: list[Row]
    runs: dict[str, list[LineRun]]


def by_line(lines: Sequence[str], rows: Sequence[Row]) -> dict[str, list[LineRun]]:
    """``LINE_RUNS``'s rows by line (every line asked has its list, maybe empty)."""
    found: dict[str, list[LineRun]] = {line: [] for line in lines}
    for row in rows:
        found.setdefault(row[0], []).append(LineRun._make(row))
    return found
