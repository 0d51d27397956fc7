"""The claim (R1, R6, B10), written once: the loop that turns a backend's ``CLAIM`` rows
(``dialect.ClaimRow``) into leases, inside the caller's write transaction.

A row whose ``task_id`` is None is a run the statement locked but could not lease: its head was
written after the statement's snapshot, or a lease another claimer committed meanwhile still
holds it (PostgreSQL: the next statement, with a fresh snapshot, sees either). ``options`` is
the task's declared options as the ``task_options`` table keeps them (JSON text, None: none
declared): its ``max_attempts`` bounds the claim (R6, B11) instead of the claimer's.
``signal_id``: the signal that resumed the task's wait (B14; None: none), handed to the handler
as ``ctx.signal``; ``parent_id``: the run's parent (its end is counted there); ``join_task``:
the task that joins the run's children (when it is this one, the claim reads them:
``ctx.children``).
"""

from __future__ import annotations

import dataclasses
import itertools

from ..codec import check_name, check_owner, check_queue, checked_served, loads, task_options
from ..dialect import ClaimRow, Tx
from ..driver import ClaimAsk, Handback, Placing
from ..errors import InvalidPayload
from ..limits import Gating
from ..types import ClaimRequest, Lease
from . import gates
from .events import emit
from .failures import attempt_ended, fail_run
from .limits import Gatekeeper
from .waits import delivered, joined

# One claim runs at most this many statements. Each turn hands out leases, fails runs
# (attempts exhausted, payload undecodable) or finds heads its snapshot could not see, so the
# bound is never reached in practice: it only keeps a claim from ever looping for good.
CLAIM_TURNS = 1000
_turns = itertools.count()  # which goes first, gated runs or the others: each in turn


def claim(
    tx: Tx, req: ClaimRequest, keeper: Gatekeeper | None = None, *, gated: bool = True
) -> list[Lease]:
    """Up to ``req.limit`` leases, each of a different run: runs whose tasks have limits from
    their gates' lines (``gates.admitted``), the others in the backend's order (each turn sees
    what the earlier turns wrote: R1 holds across the batch). Which of the two asks first
    alternates from claim to claim, so that neither can starve the other. ``keeper``: the
    declarations as the store last read them: a run enqueued before its task had limits
    joins its line at its first claim instead of running (``regate``). ``gated`` False: the
    plain walk only (the lane's claim: deliveries have no limits)."""
    if req.also is not None:  # (a second claim, for other slots: the lane's, after this one)
        first = claim(tx, dataclasses.replace(req, also=None), keeper)
        # the plain walk only: the lane's queue holds no gated run (deliveries have no
        # limits), and a second pass through the gates in the same transaction (whose gate
        # writes wait for the COMMIT) let the limits chaos soak start 18 runs in 0.5 s under a
        # rate of 10 a second (tests/chaos/test_limits_chaos.py)
        return first + claim(tx, req.also, keeper, gated=False)
    check_owner(req.owner)
    if req.task is not None:
        check_name(req.task, "a batch claim's task")
    skip = tuple(check_queue(q) for q in dict.fromkeys(req.skip))
    queues = None if req.queues is None else [check_queue(q) for q in dict.fromkeys(req.queues)]
    if queues is not None:
        queues = [q for q in queues if q not in skip]
    tasks = None if req.tasks is None else checked_served(tuple(req.tasks))
    if queues == [] or tasks == () or req.limit < 1:
        return []
    req = dataclasses.replace(req, queues=None if queues is None else tuple(queues),
                              skip=skip if queues is None else (), tasks=tasks)  # fmt: skip
    if not req.begins and req.start:  # B3: the first ones begin at once, the others wait
        first = claim(tx, dataclasses.replace(req, limit=req.start), keeper, gated=gated)
        rest = dataclasses.replace(req, limit=req.limit - len(first), start=0)
        return first + claim(tx, rest, keeper, gated=gated)
    if not gated or req.task is not None:  # (a batch's claim: runs in no line only)
        return _claim(tx, req, req.limit, keeper)
    if next(_turns) % 2:
        opened = gates.opened(tx, req.queues, req.limit, req.tasks)
        leases = gates.admitted(tx, req, req.limit, _lease, opened) if opened else []
        return leases + _claim(tx, req, req.limit - len(leases), keeper)
    # the plain walk first, then the gates: on PostgreSQL the open gates are locked only from
    # here to the end of the claim, so claimers that share a gate hold it as briefly as can be
    leases = _claim(tx, req, req.limit, keeper)
    want = req.limit - len(leases)
    if want < 1 or not (opened := gates.opened(tx, req.queues, want, req.tasks)):
        return leases  # no line may admit a run now: the claim was the plain one
    return leases + gates.admitted(tx, req, want, _lease, opened)


def regate(tx: Tx, lease: Lease, gating: Gating) -> None:
    """A run claimed as ungated whose task has limits now (declared after it was enqueued):
    its claim goes back unspent (a hand-back) and the run joins its line, where the claim
    admits it by its gates like any other."""
    back = Handback(lease.run_id, lease.task_id, lease.attempt, lease.owner)
    if tx.complete([back])[0].written:
        emit(tx, "step.handed_back", lease.run_id, lease.task, lease.attempt, regated=True)
        tx.count("REGATE", {**back.params(tx.now), **gating.params()})
        lines = (gating.line,) if gating.line else ()
        tx.place_gates(Placing(tuple(sorted(gating.gates)), lines))


def _claim(tx: Tx, req: ClaimRequest, limit: int, keeper: Gatekeeper | None = None) -> list[Lease]:
    """Up to ``limit`` leases of runs without limits (those in no line)."""
    if limit < 1:
        return []
    leases: list[Lease] = []
    unseen = 0  # turns in a row that leased nothing, only found runs with unseen heads
    for _ in range(CLAIM_TURNS):
        ask = limit - len(leases)
        if ask <= 0:
            break
        rows = tx.claim_rows(ClaimAsk(req.owner, req.ttl, ask, req.queues, req.skip, req.begins,
                                      req.tasks, req.task))  # fmt: skip
        if not rows:
            break
        got = 0
        for row in rows:
            if row.task_id is not None:
                got += 1
                lease = _lease(tx, req, row)
                if lease is None:
                    continue
                if keeper is not None and not lease.gates and keeper.gated(lease.task):
                    regate(tx, lease, keeper.of(lease.task, lease.payload))
                    continue
                leases.append(lease)
        unseen = 0 if got else unseen + 1
        if unseen > 1:  # held runs whose head even a fresh snapshot cannot lease
            break
        if got == len(rows) < ask:  # it took every run it could lock and lease
            break
    return leases


def _lease(tx: Tx, req: ClaimRequest, row: ClaimRow) -> Lease | None:
    """The lease a claimed row gives, or None when the claim failed its run instead: attempts
    exhausted (R6) or a payload no worker can decode (B10). Never raises for a bad row."""
    task_id, run_id, attempts, queue = row.task_id, row.run_id, row.attempts, row.queue
    name = row.name or ""  # (a row with a task has its name)
    assert task_id is not None  # (only a row with a task is made a lease)
    options = task_options(row.options)
    limit = options.max_attempts or req.max_attempts  # B11: the task's own bound, if declared
    if attempts - row.attempt_base > limit:  # R6: attempt max+1 never runs
        attempt_ended(tx, run_id, task_id, "exhausted")
        dropped = tx.one("DROP_EXHAUSTED_LEASE", {"run_id": run_id, "task_id": task_id})
        # no handler raised: every attempt died, timed out or lost its lease
        error = (dropped[0] if dropped else None) or (
            f"{limit} attempts of task {name!r} ended without a commit (the "
            "worker died, timed out or lost its lease each time)"
        )
        fail_run(tx, run_id, queue, "task_attempts_exhausted", error, name, attempts)
        return None
    try:
        decoded = loads(row.payload, "its payload"), loads(row.state, "its run's state")
    except InvalidPayload as exc:  # never kill the claimer: fail that run, claim on
        attempt_ended(tx, run_id, task_id, "failed", str(exc))
        tx.count("DROP_EXHAUSTED_LEASE", {"run_id": run_id, "task_id": task_id})
        fail_run(tx, run_id, queue, "undecodable_payload", f"task {task_id}: {exc}", name,
                 attempts)  # fmt: skip
        return None
    was: tuple[str | None, int | None] = (None, None)
    if row.takeover:  # whose lease it took over (rare: one statement more)
        was = tx.one("TAKEN_FROM", {"run_id": run_id, "task_id": task_id}) or (None, None)
        emit(tx, "lease.taken_over", run_id, name, attempts, owner=req.owner, task_id=task_id,
             previous_owner=was[0], previous_attempt=was[1])  # fmt: skip
    else:
        emit(tx, "step.claimed", run_id, name, attempts, owner=req.owner, task_id=task_id)
    return Lease(
        task_id=task_id,
        run_id=run_id,
        task=name,
        payload=decoded[0],
        attempt=attempts,
        owner=req.owner,
        expires_at=float(row.expires_at),
        claimed_at=float(row.claimed_at),
        state=decoded[1],
        revision=row.revision,
        tries=attempts - row.attempt_base,
        takeover=bool(row.takeover),
        queue=queue,
        options=options,
        gates=tuple(g for g in (row.gate_a, row.gate_b, row.gate_c) if g),
        reserved=row.reserved,
        signal=delivered(tx, row.signal_id),
        parent_id=row.parent_id,
        children=joined(tx, run_id, task_id) if row.join_task == task_id else None,
        traceparent=row.traceparent,
        previous_owner=was[0],
        previous_attempt=was[1],
        # a lease taken over from this very claimer waits for its older handler, which may
        # still run there: its start is recorded when it begins (as the claim statement did)
        started=req.begins and was[0] != req.owner,
        version=row.version,
    )
