"""Flow control in the claim (issue 24), written once: a run whose task has limits waits in its
gate's **line**, and a claim admits runs from the lines of the gates that have room, in the same
transaction that leases them.

- **Which gates.** ``OPEN_GATES``: the gates whose ``ready_at`` has come, the one served least
  recently first (a gate served is put back at the end: ``ready_at = now``), so lines take
  turns — round-robin across keys: a tenant with 100,000 queued runs cannot starve one with 10.
  On PostgreSQL the claimer locks each gate it looks at, skipping those another claimer holds,
  so two claimers never spend one gate's room twice and never wait on each other.
- **How much room.** ``GATE_STATE``: the gate's numbers (``limits``) and its buckets; the live
  leases that hold one of its slots are counted there and then (a lease that ended or expired
  frees its slot by itself, and a takeover never counts twice). The rate and token buckets
  refill with time (``store/limits.py``). A run is admitted only when **every** gate of its task
  has room: a slot, a rate token, its token reservation, and no pause.
- **Which runs.** ``LINE_RUNS``: the first claimable runs of the line in the served queues (a
  higher priority first, then head order), locked; ``CLAIM_RUNS`` leases the admitted ones
  exactly as the claim does (R1-R6 unchanged: the lease arbitrates there too).
- **Closing.** A gate without room gets ``ready_at`` set to the moment it may have some (its
  bucket refilled, its pause over, its first live lease expired); a line with nothing to take,
  to its next due run (or NULL: nothing waits). So a claim never walks runs waiting on a full
  gate, however many there are; a lease that ends reopens its gates at once (``GATE_SETTLE``)
  and idle workers hear of it (PostgreSQL: ``NOTIFY``).
- **Settling.** Every commit under a gated lease settles its gates in the same fenced
  transaction (``settle``): the reservation comes back minus what the handler reported using
  (``ctx.usage``; without a report the reservation is what it cost), a hand-back or a
  ``RetryAfter`` gives its reservation (and a hand-back its rate token) back, and ``RetryAfter``
  pauses the gates for everyone. A refused (zombie) commit settles nothing. A lease that
  expired gives its reservation back when it is taken over.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..dialect import Params, Row, Tx
from ..limits import refill, when_level
from ..types import CasResult, ClaimRequest, Commit, Lease

GATES_AT_ONCE = 64  # open gates one claim looks at, at most
LeaseMaker = Callable[[Tx, ClaimRequest, Row], Lease | None]
SPENT_ATTEMPT = frozenset({"finish", "advance", "wait", "release", "fail", "drop"})  # charge tokens


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

    @classmethod
    def of(cls, row: Row) -> GateState:
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

    def decide(self, ready_at: float | None, blocked_by: str | None = None) -> None:
        self.ready_at, self.blocked_by, self.decided, self.dirty = ready_at, blocked_by, True, True

    def params(self, now: float) -> Params:
        return {"gate": self.gate, "level": self.level, "level_at": self.level_at,
                "tok_level": self.tok_level, "tok_at": self.tok_at, "starts": self.starts,
                "ready_at": self.ready_at if self.decided else now,
                "blocked_by": self.blocked_by, "keep": not self.decided,
                "now": now}  # fmt: skip


class Admission:
    """The gates one claim has looked at, by name (None: another claimer holds it)."""

    def __init__(self, tx: Tx, now: float, ttl: float) -> None:
        self.tx, self.now, self.ttl = tx, now, ttl
        self.states: dict[str, GateState | None] = {}

    def state(self, gate: str) -> GateState | None:
        if gate not in self.states:
            self.read([gate])
        return self.states[gate]

    def read(self, gates: Sequence[str]) -> None:
        """The states of the gates not read yet, in one statement (a gate with no row: another
        claimer holds it)."""
        unread = sorted(set(gates) - self.states.keys())
        if unread:
            rows = self.tx.rows("GATE_STATE", {"gates": unread, "now": self.now})
            found = {row[0]: GateState.of(row) for row in rows}
            self.states.update((g, found.get(g)) for g in unread)

    def write_back(self) -> None:
        """Every gate the claim changed, in name order, written just before the COMMIT (on
        PostgreSQL in its round trip): nothing later in the claim reads a gate, and the gates
        it locked are let go sooner."""
        dirty = sorted((s for s in self.states.values() if s and s.dirty), key=lambda s: s.gate)
        self.tx.at_commit("GATE_WRITE", [state.params(self.now) for state in dirty])


@dataclass(frozen=True)
class Opened:
    """The gates whose line may admit a run now (``OPEN_GATES``, locked on PostgreSQL), and the
    moment the claim stands at, read after their locks."""

    gates: list[str]
    now: float

    def __bool__(self) -> bool:
        return bool(self.gates)


def opened(tx: Tx) -> Opened:
    """The gates whose line may admit a run now, the one served least recently first (none:
    the claim needs no more than its plain walk). The settling of this transaction's commits
    goes first (``Tx.before_gates``; on PostgreSQL in the same round trip, with the clock)."""
    rows, now = tx.ahead_then("OPEN_GATES", {"now": tx.now, "limit": GATES_AT_ONCE})
    return Opened([row[0] for row in rows], now)


def admitted(
    tx: Tx, req: ClaimRequest, want: int, lease: LeaseMaker, gates_open: Opened
) -> list[Lease]:
    """Up to ``want`` leases of gated runs from the lines of ``gates_open`` whose gates all
    have room (the module's docstring); ``lease`` turns a claim row into a lease (or None: the
    claim failed its run, R6/B10)."""
    if want < 1:
        return []
    now, opened = gates_open.now, gates_open.gates
    gates = Admission(tx, now, req.ttl)
    queues = None if req.queues is None else list(req.queues)
    leases: list[Lease] = []
    served: set[str] = set()
    if len(opened) > 1:  # one run per gate, in turn, many lines in one statement
        leases = _one_each(tx, req, want, opened, gates, lease, served)
    for line in opened:  # then more from the gates with room left (a line alone: all at once)
        if len(leases) >= want:
            break
        own = gates.state(line)
        if own is None or own.decided:
            continue
        room = own.room(now)
        if room < 1:
            own.decide(own.next_open(now, 0))
            continue
        ask = min(room, want - len(leases))
        found = _line_runs(tx, [line], queues, ask, now).get(line)
        if not found:
            if len(opened) == 1:
                _nothing_due(tx, own, now)
            continue
        ok = _admit(gates, line, found, now)
        if ok:
            served.add(line)
            leases += _lease_all(tx, req, ok, gates, now, lease)
    for line in served:
        state = gates.states.get(line)
        if state is not None and not state.decided:
            state.decide(now if state.admits(now, 0) else state.next_open(now, 0))
    gates.write_back()
    return leases


def _one_each(
    tx: Tx, req: ClaimRequest, want: int, opened: Sequence[str], gates: Admission,
    lease: LeaseMaker, served: set[str],
) -> list[Lease]:  # fmt: skip
    """Lines take turns: the first run of each line with room, as many lines as leases are
    wanted, each round one statement for the runs and one for their leases (a line with
    nothing to take closes until its next due run, and the next lines are asked)."""
    now, queues = gates.now, None if req.queues is None else list(req.queues)
    leases: list[Lease] = []
    waiting = list(opened)
    while waiting and len(leases) < want:
        asked: list[str] = []
        while waiting and len(asked) < want - len(leases):
            gates.read(waiting[: want - len(leases) - len(asked)])  # the gates to ask next
            own = gates.state(line := waiting.pop(0))
            if own is None or own.decided:
                continue
            if own.room(now) < 1:
                own.decide(own.next_open(now, 0))
                continue
            asked.append(line)
        if not asked:
            break
        found = _line_runs(tx, asked, queues, 1, now)
        ok: list[Row] = []
        for line in asked:
            own = gates.state(line)
            if line not in found:
                if own is not None and not own.decided:
                    _nothing_due(tx, own, now)
                continue
            if own is None or own.decided:  # closed by an earlier line's run (blocked_by)
                continue
            admitted_here = _admit(gates, line, found[line], now)
            if admitted_here:
                served.add(line)
                ok += admitted_here
        if ok:
            leases += _lease_all(tx, req, ok, gates, now, lease)
    return leases


def _line_runs(
    tx: Tx, lines: list[str], queues: list[str] | None, limit: int, now: float
) -> dict[str, list[Row]]:
    """``LINE_RUNS``: the first ``limit`` claimable runs of each line, by line (locked)."""
    found: dict[str, list[Row]] = {}
    params = {"lines": lines, "queues": queues, "limit": limit, "now": now}
    for row in tx.rows("LINE_RUNS", params):
        found.setdefault(row[0], []).append(tuple(row[1:]))
    return found


def _nothing_due(tx: Tx, own: GateState, now: float) -> None:
    """A line with nothing to take closes until its next due run (None: nothing waits)."""
    nxt = tx.one("LINE_NEXT", {"line": own.gate, "now": now})
    own.decide(None if nxt is None else nxt[0])


def _admit(gates: Admission, line: str, found: Sequence[Row], now: float) -> list[Row]:
    """The runs of ``found`` (the line's first ones) whose every gate has room, each admitted
    (in memory) in turn. A gate without room closes until it may have some; when it is another
    limit's gate, the line closes with it and reopens when that gate does (``blocked_by``)."""
    ok = []
    for row in found:
        _run_id, _task_id, reserve, before, *names = row
        # a takeover: its predecessor's reservation comes back as it is taken over
        need = max(0, (reserve or 0) - (before or 0))
        states = [gates.state(g) for g in names if g]
        if any(s is None for s in states):
            continue  # a gate another claimer holds: this run waits for the next claim
        held = [s for s in states if s is not None]
        if all(s.admits(now, need) for s in held):
            for s in held:
                s.admit(now, need, now + gates.ttl)
            ok.append(row)
            continue
        for s in held:
            if not s.admits(now, need):
                at = s.next_open(now, need)
                s.decide(at)
                own = gates.state(line)
                if s.gate != line and own is not None and not own.decided:
                    own.decide(at, blocked_by=s.gate)
        break  # the line's order holds: what stands behind a blocked run waits too
    return ok


def _lease_all(
    tx: Tx, req: ClaimRequest, rows: Sequence[Row], gates: Admission, now: float,
    lease: LeaseMaker,
) -> list[Lease]:  # fmt: skip
    params = {"run_ids": [r[0] for r in rows], "owner": req.owner, "ttl": float(req.ttl),
              "now": tx.now}  # fmt: skip
    made: list[Lease] = []
    wanted = {r[0]: r for r in rows}
    leased: set[int] = set()
    for claim_row in tx.rows("CLAIM_RUNS", params):
        run_id = claim_row[1]
        if claim_row[0] is None:
            continue
        leased.add(run_id)
        got = lease(tx, req, claim_row[:-1])
        if got is None:  # failed its run instead (R6, B10): nothing runs, nothing is spent
            _undo(gates, wanted[run_id], now)
            continue
        made.append(got)
    for run_id, row in wanted.items():  # admitted but not leased (its head moved): undo
        if run_id not in leased:
            _undo(gates, row, now)
    return made


def _undo(gates: Admission, row: Row, now: float) -> None:
    """An admitted run that did not get its lease: what the admission spent comes back."""
    _run_id, _task_id, reserve, before, *names = row
    for g in (n for n in names if n):
        if (s := gates.state(g)) is not None:
            s.give_back(now, max(0, (reserve or 0) - (before or 0)))
            s.live -= 1


def settle(tx: Tx, commits: Sequence[Commit], results: Sequence[CasResult]) -> None:
    """What each written commit under a gated lease gives back to its gates, in the same
    transaction (a refused one settles nothing): sorted by gate, one statement each, sent
    when the transaction's claim first looks at its gates (``opened``), or else before
    COMMIT: a settle waits for a gate another claimer holds, and holds it from there on."""
    per_gate: dict[str, Params] = {}
    for commit, result in zip(commits, results, strict=True):
        lease = commit.lease
        if result is not CasResult.OK or not lease.gates:
            continue
        reserved = lease.reserved or 0
        if commit.kind in SPENT_ATTEMPT:
            charged = reserved if commit.used_tokens is None else commit.used_tokens
        else:  # a hand-back never started; a RetryAfter was refused by the provider
            charged = commit.used_tokens or 0
        for gate in lease.gates:
            p = per_gate.setdefault(gate, {"gate": gate, "back": 0, "charged": 0, "unstart": 0,
                                           "pause": None})  # fmt: skip
            p["back"] += reserved - charged
            p["charged"] += charged
            p["unstart"] += commit.kind == "handback"
            if commit.kind == "retry_after" and commit.pause and commit.delay > 0:
                p["pause"] = max(p["pause"] or 0.0, commit.delay)
    tx.before_gates("GATE_SETTLE", [{**per_gate[g], "now": tx.now} for g in sorted(per_gate)])
