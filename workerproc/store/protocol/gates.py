"""Flow control in the claim, written once: a run whose task has limits waits in its
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
- **Never fits.** A run whose reservation is above a token bucket's size (its limits changed
  after it was enqueued) fails where the claim finds it (``reservation_too_large``), and the
  claim goes on down its line: a run that can never enter never keeps its line closed.
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

from collections.abc import Callable, Sequence

from ..dialect import ClaimRow, Row, Tx
from ..driver import GateSettle, LeaseRuns, LineRun, Opened
from ..limits import GateState, never_fits, split_gate, too_large
from ..types import CasResult, ClaimRequest, Commit, Lease
from .failures import refuse_too_large

GATES_AT_ONCE = 64  # open gates one claim looks at, at most
LeaseMaker = Callable[[Tx, ClaimRequest, ClaimRow], Lease | None]
SPENT_ATTEMPT = frozenset({"finish", "advance", "wait", "release", "fail", "drop"})  # charge tokens


class Admission:
    """The gates one claim has looked at, by name (None: another claimer holds it)."""

    def __init__(self, tx: Tx, now: float, ttl: float, tasks: Sequence[str] | None = None) -> None:
        self.tx, self.now, self.ttl = tx, now, ttl
        self.tasks = None if tasks is None else list(tasks)  # the served tasks (None: any)
        self.states: dict[str, GateState | None] = {}
        # the first runs of lines asked early (with their limit), each taken once
        self.ahead: dict[str, tuple[int, list[LineRun]]] = {}

    def first_look(self, lines: list[str], queues: list[str] | None, limit: int) -> None:
        """The states of the gates of ``lines`` (which this claim holds: ``open_gates`` locked
        them) and the first ``limit`` runs of each line, read together (``Tx.look_gates``),
        unless asked already (``keep_early``). A line without room has its runs locked for
        nothing, until the COMMIT: only a claimer that holds a line's gate asks for its runs,
        so no one else wanted them."""
        unread = sorted(set(lines) - self.states.keys())
        ask = [line for line in lines if self.ahead.get(line, (0, []))[0] < limit]
        if unread or ask:
            look = self.tx.look_gates(unread, ask, queues, limit, self.tasks)
            self._keep(unread, look.states)
            self.ahead.update((line, (limit, runs)) for line, runs in look.runs.items())

    def keep_early(self, early: Opened) -> None:
        """What ``open_gates`` read of the gates this transaction's commits settled (their
        settles locked them first)."""
        if early.held:
            self._keep(early.held, early.states)
            self.ahead.update((line, (early.limit, runs)) for line, runs in early.runs.items())

    def state(self, gate: str) -> GateState | None:
        if gate not in self.states:
            self.read([gate])
        return self.states[gate]

    def read(self, gates: Sequence[str]) -> None:
        """The states of the gates not read yet, in one statement (a gate with no row: another
        claimer holds it)."""
        unread = sorted(set(gates) - self.states.keys())
        if unread:
            self._keep(unread, self.tx.look_gates(unread).states)

    def _keep(self, asked: list[str], rows: list[Row]) -> None:
        found = {row[0]: GateState.of(row) for row in rows}
        self.states.update((g, found.get(g)) for g in asked)

    def line_runs(self, lines: list[str], queues: list[str] | None, limit: int) -> list[LineRun]:
        """The first ``limit`` claimable runs of each line (locked), in the order of
        ``lines`` (``Tx.look_gates``); those the first look found are taken from it, once."""
        early: dict[str, list[LineRun]] = {}
        rest = []
        for line in lines:
            asked, rows = self.ahead.pop(line, (0, []))
            if asked < limit:
                rest.append(line)
            else:
                early[line] = rows[:limit]
        looked = self.tx.look_gates((), rest, queues, limit, self.tasks).runs if rest else {}
        return [row for line in lines for row in early.get(line) or looked.get(line) or ()]

    def write_back(self) -> None:
        """Every gate the claim changed, in name order (``Tx.write_gates``: nothing later in
        the claim reads a gate, so the driver may write them with the COMMIT, and the gates it
        locked are let go sooner)."""
        dirty = sorted((s for s in self.states.values() if s and s.dirty), key=lambda s: s.gate)
        self.tx.write_gates(dirty, self.now)


def opened(
    tx: Tx, queues: Sequence[str] | None = None, want: int = 0,
    tasks: Sequence[str] | None = None,
) -> Opened:  # fmt: skip
    """The gates whose line may admit a run now, the one served least recently first (none:
    the claim needs no more than its plain walk): ``Tx.open_gates``, after the settling of
    this transaction's commits (the gate writes held back, ``Tx.settle_gates``), with the
    states of the settled gates and up to ``want`` runs of their lines (only a claimer that
    holds a line's gate leases its runs, so no one else wanted them); ``tasks``: the served
    tasks (None: any, B22)."""
    return tx.open_gates(None if queues is None else list(queues), want, GATES_AT_ONCE,
                         None if tasks is None else list(tasks))  # fmt: skip


def admitted(
    tx: Tx, req: ClaimRequest, want: int, lease: LeaseMaker, gates_open: Opened
) -> list[Lease]:
    """Up to ``want`` leases of gated runs from the lines of ``gates_open`` whose gates all
    have room (the module's docstring); ``lease`` turns a claim row into a lease (or None: the
    claim failed its run, R6/B10)."""
    if want < 1:
        return []
    now, opened = gates_open.now, gates_open.gates
    gates = Admission(tx, now, req.ttl, req.tasks)
    gates.keep_early(gates_open)
    queues = None if req.queues is None else list(req.queues)
    leases: list[Lease] = []
    served: set[str] = set()
    # the first lines' gates and first runs at once: one run each of many, or all of one
    gates.first_look(opened[:want], queues, 1 if len(opened) > 1 else want)
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
        found = gates.line_runs([line], queues, ask)
        if not found:
            if len(opened) == 1:
                _nothing_due(tx, own, now)
            continue
        ok = _admit(gates, line, found, now)
        if ok:
            served.add(line)
            leases += _lease_all(tx, req, ok, gates, now, lease)
    for line in served:  # its turn moves to the back of the lines (``turn``)
        state = gates.states.get(line)
        if state is not None:
            state.served = state.dirty = True
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
        found = gates.line_runs(asked, queues, 1)
        ok: list[LineRun] = []
        for line in asked:
            own, runs = gates.state(line), [row for row in found if row.line == line]
            if not runs:
                if own is not None and not own.decided:
                    _nothing_due(tx, own, now)
                continue
            if own is None or own.decided:  # closed by an earlier line's run (blocked_by)
                continue
            admitted_here = _admit(gates, line, runs, now)
            if admitted_here:
                served.add(line)
                ok += admitted_here
        if ok:
            leases += _lease_all(tx, req, ok, gates, now, lease)
    return leases


def _nothing_due(tx: Tx, own: GateState, now: float) -> None:
    """A line with nothing to take closes until its next due run (None: nothing waits)."""
    nxt = tx.one("LINE_NEXT", {"line": own.gate, "now": now})
    own.decide(None if nxt is None else nxt[0], idle=True)


def _admit(gates: Admission, line: str, found: Sequence[LineRun], now: float) -> list[LineRun]:
    """The runs of ``found`` (the line's first ones) whose every gate has room, each admitted
    (in memory) in turn. A gate without room closes until it may have some; when it is another
    limit's gate, the line closes with it and reopens when that gate does (``blocked_by``)."""
    ok = []
    for row in found:
        reserve = row.reserve
        states = [gates.state(g) for g in row.gates]
        if any(s is None for s in states):
            continue  # a gate another claimer holds: this run waits for the next claim
        held = [s for s in states if s is not None]
        if (never := next((s for s in held if never_fits(reserve, s)), None)) is not None:
            _refuse(gates, row, never)  # it could wait for ever, and the line behind it
            continue
        need = row.need  # a takeover: its predecessor's reservation comes back
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


def _refuse(gates: Admission, row: LineRun, never: GateState) -> None:
    """A run whose reservation ``never``'s token bucket can never hold (its limits changed
    after it was enqueued: ``limits set``, another host's declaration) fails in the claim
    instead of closing its line for good; an expired lease on it gives its reservation back."""
    limit, _key = split_gate(never.gate)

    def why(task: str) -> str:
        return too_large(task, row.reserve or 0, limit, never.token_burst or 0)

    refuse_too_large(gates.tx, row.run_id, row.task_id, row.before is not None, why)
    before = row.before or 0
    for g in row.gates if before else ():
        if (s := gates.state(g)) is not None:
            s.give_back(gates.now, before)


def _lease_all(
    tx: Tx, req: ClaimRequest, rows: Sequence[LineRun], gates: Admission, now: float,
    lease: LeaseMaker,
) -> list[Lease]:  # fmt: skip
    ask = LeaseRuns(tuple(r.run_id for r in rows), req.owner, req.ttl, req.begins)
    made: list[Lease] = []
    wanted = {r.run_id: r for r in rows}
    leased: set[int] = set()
    for claim_row in tx.lease_runs(ask):
        run_id = claim_row.run_id
        if claim_row.task_id is None:
            continue
        leased.add(run_id)
        got = lease(tx, req, claim_row)
        if got is None:  # failed its run instead (R6, B10): nothing runs, nothing is spent
            _undo(gates, wanted[run_id], now)
            continue
        made.append(got)
    for run_id, row in wanted.items():  # admitted but not leased (its head moved): undo
        if run_id not in leased:
            _undo(gates, row, now)
    return made


def _undo(gates: Admission, row: LineRun, now: float) -> None:
    """An admitted run that did not get its lease: what the admission spent comes back."""
    for g in row.gates:
        if (s := gates.state(g)) is not None:
            s.give_back(now, row.need)
            s.live -= 1


def settle(tx: Tx, commits: Sequence[Commit], results: Sequence[CasResult]) -> None:
    """What each written commit under a gated lease gives back to its gates, in the same
    transaction (a refused one settles nothing), sorted by gate (``Tx.settle_gates``: written
    before the transaction's claim looks at its gates, ``opened``, or else before COMMIT; as a
    settle waits for a gate another claimer holds, and holds it from there on, the driver
    writes it as late as that allows)."""
    per_gate: dict[str, GateSettle] = {}
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
            p = per_gate.setdefault(gate, GateSettle(gate))
            p.back += reserved - charged
            p.charged += charged
            p.unstart += commit.kind == "handback"
            if commit.kind == "retry_after" and commit.pause and commit.delay > 0:
                p.pause = max(p.pause or 0.0, commit.delay)
    tx.settle_gates([per_gate[g] for g in sorted(per_gate)])
