"""Fenced writes (R2, R5, B3, B4), written once: each commit kind (``KINDS``: how it is written,
what its refusal means, what it emits), the fence every one of them carries, and what a refusal
means. Every function runs inside the caller's write transaction.

Every write after a claim matches task id AND owner AND attempt AND a live lease (the fence,
``fence``); a write that matches nothing changed nothing and is refused: recorded as evidence
(``INSERT_REJECTION``) in the transaction that refused it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..calls import usage_row
from ..codec import Encoded
from ..dialect import Params, Tx
from ..driver import Ack, Advance, Completion, Finish, Handback, Release, SetState
from ..records import record as value_record
from ..types import CasResult, Commit, Lease
from .events import emit
from .failures import attempt_ended, fail_run
from .gates import settle
from .totals import counted, ended
from .waits import ended_children, spawn, wait

Write = Callable[[Tx, Commit, Encoded], CasResult]  # one commit, fenced by its lease
Emit = Callable[[Tx, Commit, Encoded], None]  # the events of one commit that was written


def fence(lease: Lease, now: float | None) -> Params:
    """The parameters every fenced statement matches (R2), and the run it locks first."""
    return {
        "task_id": lease.task_id,
        "owner": lease.owner,
        "attempt": lease.attempt,
        "now": now,
        "run_id": lease.run_id,
    }


def rejected(tx: Tx, lease: Lease, op: str) -> None:
    """Keep a write of ``lease`` refused as evidence, in the transaction that refused it, and
    its event (the only one a refused write makes)."""
    tx.count("INSERT_REJECTION", {**fence(lease, tx.now), "op": op})
    emit(tx, "write.refused", lease.run_id, lease.task, lease.attempt, op=op,
         owner=lease.owner, task_id=lease.task_id)  # fmt: skip


def live(tx: Tx, lease: Lease) -> bool:
    """Whether ``lease`` is still its owner's and live (``CHECK_FENCE``)."""
    return tx.one("CHECK_FENCE", fence(lease, tx.now)) is not None


def held(tx: Tx, lease: Lease, op: str) -> bool:
    """Whether ``lease`` is still live (``live``); if not, the refusal of its write ``op`` is
    recorded (``rejected``)."""
    if not live(tx, lease):
        rejected(tx, lease, op)
        return False
    return True


def refused(tx: Tx, lease: Lease, op: str) -> CasResult:
    """A fenced compare-and-set changed nothing: a lost lease (recorded) or a moved run."""
    return CasResult.CONFLICT if held(tx, lease, op) else CasResult.LEASE_LOST


def record(kind: type[Completion], lease: Lease, enc: Encoded) -> Completion:
    """A commit's completion (``driver.complete``'s record of ``kind``): its lease's fence
    and its encoded values."""
    run, task, attempt, owner = lease.run_id, lease.task_id, lease.attempt, lease.owner
    if kind is Finish:
        return Finish(run, task, attempt, owner, enc.revision, enc.state, enc.result)
    if kind is Advance:
        return Advance(run, task, attempt, owner, enc.revision, enc.state, enc.queue, enc.name,
                       enc.payload, enc.delay, enc.line, enc.gate_a, enc.gate_b, enc.gate_c,
                       enc.tokens, enc.version)  # fmt: skip
    if kind is Release:
        return Release(run, task, attempt, owner, enc.delay, enc.error)
    if kind is SetState:
        return SetState(run, task, attempt, owner, enc.revision, enc.state)
    if kind is Handback:  # the fence alone
        return Handback(run, task, attempt, owner)
    return Ack(run, task, attempt, owner)


def completed(tx: Tx, kind: type[Completion], lease: Lease, enc: Encoded) -> bool:
    """A completion of one commit, fenced and judged on its own: whether it was written (the
    driver's ``complete``, N = 1)."""
    return tx.complete([record(kind, lease, enc)])[0].written


def params(tx: Tx, commit: Commit, enc: Encoded) -> Params:
    """The named parameters of a commit's own statements: its values and its fence."""
    return {**enc.params(), **fence(commit.lease, tx.now)}


# -- what each kind writes, when it is not one completion alone ---------------------------------
def _wait(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    """An advance whose next task is not due, then the wait for a signal (B14)."""
    if not completed(tx, Advance, commit.lease, enc):
        return _refusal(tx, commit)
    return wait(tx, params(tx, commit, enc))


def _spawn(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    """An advance whose next task joins the children, then the children (B14)."""
    if not completed(tx, Advance, commit.lease, enc):
        return _refusal(tx, commit)
    return spawn(tx, params(tx, commit, enc), commit.children)


def _held(write: Write) -> Write:
    """``write`` once the lease is found live (else the refusal, recorded)."""

    def checked(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
        if not held(tx, commit.lease, KINDS[commit.kind].op):
            return CasResult.LEASE_LOST
        return write(tx, commit, enc)

    return checked


@_held
def _drop(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    tx.count("TASK_DONE", fence(commit.lease, tx.now))
    return CasResult.OK


def _back_unspent(tx: Tx, commit: Commit, enc: Encoded) -> Params:
    """A release after the delay that spends no attempt (its statements' parameters)."""
    completed(tx, Release, commit.lease, enc)
    tx.count("UNSPEND", named := params(tx, commit, enc))
    return named


@_held
def _retry_after(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    _back_unspent(tx, commit, enc)
    return CasResult.OK


@_held
def _park(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    """Back unspent, and the run waits for ``resolve`` (B13)."""
    tx.count("MARK_PARKED", _back_unspent(tx, commit, enc))
    return CasResult.OK


@_held
def _fail(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    lease = commit.lease
    if fail_run(tx, lease.run_id, lease.queue, enc.reason or "failed", enc.error, lease.task,
                lease.attempt) == 0:  # fmt: skip
        return CasResult.CONFLICT
    attempt_ended(tx, lease.run_id, lease.task_id, "failed", enc.error)
    tx.count("TASK_FAILED", params(tx, commit, enc))
    return CasResult.OK


def _ack(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    """The task done under its lease; a run whose last task is done has succeeded: the
    completion's N = 1 call (``Ack``)."""
    lease = commit.lease
    (done,) = tx.complete([record(Ack, lease, enc)])
    if not done.written:
        return _refusal(tx, commit)
    emit(tx, "step.committed", lease.run_id, lease.task, lease.attempt, owner=lease.owner,
         task_id=lease.task_id)  # fmt: skip
    if done.ended:
        ended(tx, lease.queue, "succeeded")
        emit(tx, "run.succeeded", lease.run_id, lease.task, lease.attempt)
        if lease.parent_id is not None:
            ended_children(tx, [lease.run_id])
    return CasResult.OK


def _compare_and_set(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    """R5: the run's state moves at the expected revision of a live run, under the lease: the
    completion's N = 1 call (``SetState``)."""
    written = completed(tx, SetState, commit.lease, enc)
    return CasResult.OK if written else _refusal(tx, commit)


def _migrate(tx: Tx, commit: Commit, enc: Encoded) -> CasResult:
    """B25: the run's state moves at the expected revision under the lease, as a
    compare-and-set (``SetState``), and its task to the migration's version with it: a
    zombie's migration is refused by the fence like any write."""
    if not completed(tx, SetState, commit.lease, enc):
        return _refusal(tx, commit)
    tx.count("SET_VERSION", params(tx, commit, enc))
    return CasResult.OK


def _migrated(tx: Tx, commit: Commit, enc: Encoded) -> None:
    lease = commit.lease
    emit(tx, "step.migrated", lease.run_id, lease.task, lease.attempt, **_held_by(commit),
         from_version=lease.version, version=enc.version)  # fmt: skip


# -- what each kind emits once written ----------------------------------------------------------
def _held_by(commit: Commit) -> Params:
    return {"owner": commit.lease.owner, "task_id": commit.lease.task_id}


def _stepped(tx: Tx, commit: Commit, enc: Encoded) -> None:
    lease = commit.lease
    emit(tx, "step.committed", lease.run_id, lease.task, lease.attempt, **_held_by(commit),
         next=enc.name or None, dropped=commit.kind == "drop" or None)  # fmt: skip


def _finished(tx: Tx, commit: Commit, enc: Encoded) -> None:
    _stepped(tx, commit, enc)
    emit(tx, "run.succeeded", commit.lease.run_id, commit.lease.task, commit.lease.attempt)


def _waiting(tx: Tx, commit: Commit, enc: Encoded) -> None:
    """B14: a signal, or its children; B13: a paid call whose outcome is unknown waits for
    ``resolve`` (a park: no step committed)."""
    lease = commit.lease
    if commit.kind != "park":
        _stepped(tx, commit, enc)
    emit(tx, "run.waiting", lease.run_id, lease.task, lease.attempt,
         waiting_for=enc.wait_for,
         children=len(commit.children) if commit.kind == "spawn" else None)  # fmt: skip


def _released(tx: Tx, commit: Commit, enc: Encoded) -> None:
    lease = commit.lease
    emit(tx, "step.released", lease.run_id, lease.task, lease.attempt, **_held_by(commit),
         error=enc.error, delay=enc.delay or None,
         retry_after=commit.kind == "retry_after" or None)  # fmt: skip


def _handed_back(tx: Tx, commit: Commit, enc: Encoded) -> None:
    lease = commit.lease
    emit(tx, "step.handed_back", lease.run_id, lease.task, lease.attempt, **_held_by(commit))


@value_record
class Kind:
    """One commit kind's behaviour. ``step``: the completion that writes it whole (a batch
    of them goes as one call, ``completed``), else ``write`` writes one; ``conflict``: its
    refusal may be a moved run, not a lost lease (a compare-and-set: the fence is asked);
    ``emit``: its events once written (None: its writer emits them); ``op``: what its
    refusals are recorded as; ``settles``: a written one gives its gates back (it ends its
    lease); ``next``: it enqueues a next task (``next_task``, gated like any task)."""

    step: type[Completion] | None = None
    write: Write | None = None
    conflict: bool = False
    emit: Emit | None = None
    op: str = ""
    settles: bool = True
    next: bool = False


KINDS: dict[str, Kind] = {
    "finish": Kind(step=Finish, conflict=True, emit=_finished, op="finish"),
    "advance": Kind(step=Advance, conflict=True, emit=_stepped, op="advance", next=True),
    "release": Kind(step=Release, emit=_released, op="release"),
    "handback": Kind(step=Handback, emit=_handed_back, op="handback"),
    "wait": Kind(write=_wait, conflict=True, emit=_waiting, op="wait", next=True),
    "spawn": Kind(write=_spawn, conflict=True, emit=_waiting, op="spawn", next=True),
    "drop": Kind(write=_drop, emit=_stepped, op="drop"),
    "retry_after": Kind(write=_retry_after, emit=_released, op="retry_after"),
    "park": Kind(write=_park, emit=_waiting, op="park"),
    "fail": Kind(write=_fail, op="fail"),  # its events are ``fail_run``'s
    # the pinned single-lease calls (DESIGN.md), N = 1 of the batch; they end no gate's slot
    "ack": Kind(write=_ack, op="ack", settles=False),
    "compare_and_set": Kind(
        write=_compare_and_set, conflict=True, op="compare_and_set", settles=False
    ),
    # B25: an older run's state upgraded before the handler begins; the lease stays
    "migrate": Kind(write=_migrate, conflict=True, emit=_migrated, op="migrate", settles=False),
}


def _refusal(tx: Tx, commit: Commit) -> CasResult:
    """What a commit whose write changed nothing answers (its refusal recorded where its
    lease is lost)."""
    kind = KINDS[commit.kind]
    if kind.conflict:
        return refused(tx, commit.lease, kind.op)
    rejected(tx, commit.lease, kind.op)  # fenced by its own statement
    return CasResult.LEASE_LOST


def apply_all(tx: Tx, commits: Sequence[Commit], encoded: Sequence[Encoded]) -> list[CasResult]:
    """Every commit, each judged on its own, answers in order. Commits that are one
    completion each go together, one call per completion (``completed``), while their runs
    differ (they touch disjoint rows); a run met again, or a commit written on its own (a
    drop, a fail, a wait, ...), first sends what is gathered: everything is written in the
    order of ``commits``. Only the refused ones are then asked why, in order."""
    results: list[CasResult] = [CasResult.OK] * len(commits)
    gathered: list[tuple[int, Completion]] = []  # the completions waiting to go
    runs: set[int] = set()

    def send() -> None:
        if gathered:
            done = tx.complete([completion for _, completion in gathered])
            for i in sorted(i for (i, _), d in zip(gathered, done, strict=True) if not d.written):
                results[i] = _refusal(tx, commits[i])
        gathered.clear()
        runs.clear()

    for i, commit in enumerate(commits):
        kind = KINDS.get(commit.kind)
        if kind is None:
            raise ValueError(f"unknown commit kind {commit.kind!r}")
        if kind.step is None or commit.lease.run_id in runs:
            send()
        if kind.step is None:
            assert kind.write is not None
            results[i] = kind.write(tx, commit, encoded[i])
            continue
        gathered.append((i, record(kind.step, commit.lease, encoded[i])))
        runs.add(commit.lease.run_id)
    send()
    for commit, enc, result in zip(commits, encoded, results, strict=True):
        if result is CasResult.OK and (emitted := KINDS[commit.kind].emit) is not None:
            emitted(tx, commit, enc)
    _count_finished(tx, commits, results)
    settling = [i for i, c in enumerate(commits) if KINDS[c.kind].settles]
    settle(tx, [commits[i] for i in settling], [results[i] for i in settling])
    _keep_usage(tx, commits, results)
    return results


def _keep_usage(tx: Tx, commits: Sequence[Commit], results: Sequence[CasResult]) -> None:
    """What each written commit's execution reported (``ctx.usage``), kept for ``spend``: a
    refused one (a zombie's) keeps nothing."""
    for commit, result in zip(commits, results, strict=True):
        if result is CasResult.OK and commit.usage is not None:
            tx.count("INSERT_USAGE", usage_row(commit.lease, None, commit.usage, tx.now))


def _count_finished(tx: Tx, commits: Sequence[Commit], results: Sequence[CasResult]) -> None:
    """The runs that finishes ended, counted in the same transaction (``totals``)."""
    finished = [c for c, r in zip(commits, results, strict=True)
                if c.kind == "finish" and r is CasResult.OK]  # fmt: skip
    counted(tx, [(c.lease.queue, "succeeded", 1) for c in finished])
    ended_children(tx, [c.lease.run_id for c in finished if c.lease.parent_id is not None])
