"""Fenced writes (R2, R5, B3, B4), written once: each commit kind, the fence every one of them
carries, and what a refusal means. Every function runs inside the caller's write transaction.

Every write after a claim matches task id AND owner AND attempt AND a live lease (the fence,
``fence``); a write that matches nothing changed nothing and is refused: recorded as evidence
(``INSERT_REJECTION``) in the transaction that refused it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..calls import usage_row
from ..dialect import Params, Tx
from ..types import CasResult, Commit, Lease
from .events import emit
from .failures import attempt_ended, fail_run
from .gates import settle
from .totals import counted
from .waits import ended_children, spawn, wait

# The commits that are one logical step each (a row back: written; none: refused), by the
# catalogue name of that step. A batch of them over different runs is sent with ``Tx.many``.
ONE_STEP = {"finish": "FINISH", "advance": "ADVANCE", "release": "RELEASE",
            "handback": "HANDBACK"}  # fmt: skip
# their refusal may be a conflict, not a lost lease
CAS_KINDS = frozenset({"finish", "advance", "wait", "spawn"})


def fence(lease: Lease, now: float | None) -> Params:
    """The parameters every fenced statement matches (R2), and the run it locks first."""
    return {
        "task_id": lease.task_id,
        "owner": lease.owner,
        "attempt": lease.attempt,
        "now": now,
        "run_id": lease.run_id,
    }


def rejected(tx: Tx, fenced: Params, op: str, task: str | None = None) -> None:
    """Keep a refused write as evidence, in the transaction that refused it, and its event
    (the only one a refused write makes)."""
    tx.count("INSERT_REJECTION", {**fenced, "op": op})
    emit(tx, "write.refused", fenced["run_id"], task, fenced["attempt"], op=op,
         owner=fenced["owner"], task_id=fenced["task_id"])  # fmt: skip


def refused(tx: Tx, params: Params, op: str, task: str | None = None) -> CasResult:
    """A fenced compare-and-set changed nothing: a lost lease (recorded) or a moved run."""
    if tx.one("CHECK_FENCE", params) is None:
        rejected(tx, params, op, task)
        return CasResult.LEASE_LOST
    return CasResult.CONFLICT


def _refusal(tx: Tx, params: Params, commit: Commit) -> CasResult:
    """What a one-step commit that changed nothing answers."""
    kind, task = commit.kind, commit.lease.task
    if kind in CAS_KINDS:
        return refused(tx, params, kind, task)
    rejected(tx, params, kind, task)  # a release or hand-back is fenced by its own statement
    return CasResult.LEASE_LOST


def committed(tx: Tx, commit: Commit, params: Params) -> None:
    """The events of a commit that was written (a failure's is ``fail_run``'s)."""
    lease, kind = commit.lease, commit.kind
    held = {"owner": lease.owner, "task_id": lease.task_id}
    if kind in ("finish", "advance", "drop", "wait", "spawn"):
        emit(tx, "step.committed", lease.run_id, lease.task, lease.attempt, **held,
             next=params.get("name"), dropped=kind == "drop" or None)  # fmt: skip
        if kind == "finish":
            emit(tx, "run.succeeded", lease.run_id, lease.task, lease.attempt)
        elif kind in ("wait", "spawn"):  # B14: a signal, or its children
            emit(tx, "run.waiting", lease.run_id, lease.task, lease.attempt,
                 waiting_for=params.get("wait_for"),
                 children=len(commit.children) if kind == "spawn" else None)  # fmt: skip
    elif kind in ("release", "retry_after"):
        emit(tx, "step.released", lease.run_id, lease.task, lease.attempt, **held,
             error=params.get("error"), delay=params.get("delay") or None,
             retry_after=kind == "retry_after" or None)  # fmt: skip
    elif kind == "handback":
        emit(tx, "step.handed_back", lease.run_id, lease.task, lease.attempt, **held)
    elif kind == "park":  # B13: a paid call whose outcome is unknown waits for ``resolve``
        emit(tx, "run.waiting", lease.run_id, lease.task, lease.attempt,
             waiting_for=params.get("wait_for"))  # fmt: skip


def apply_all(tx: Tx, commits: Sequence[Commit], encoded: Sequence[Params]) -> list[CasResult]:
    """Every commit, each judged on its own, answers in order. Where the dialect pipelines,
    commits of different runs that are one step each (they touch disjoint rows) go together,
    one ``Tx.many`` per kind: one round trip. Anything else (a run twice, a drop or a fail, a
    dialect without pipelining) goes one by one, in order."""
    if not tx.pipelined or len(commits) < 2 or not _one_step_each_of_another_run(commits):
        results = [apply(tx, m, p) for m, p in zip(commits, encoded, strict=True)]
        _emit_committed(tx, commits, encoded, results)
        _count_finished(tx, commits, results)
        settle(tx, commits, results)
        _keep_usage(tx, commits, results)
        return results
    params = [{**p, **fence(m.lease, tx.now)} for m, p in zip(commits, encoded, strict=True)]
    by_kind: dict[str, list[int]] = {}
    for i, commit in enumerate(commits):
        by_kind.setdefault(commit.kind, []).append(i)
    changed = [0] * len(commits)
    for kind, members in by_kind.items():
        counts = tx.many(ONE_STEP[kind], [params[i] for i in members])
        for i, n in zip(members, counts, strict=True):
            changed[i] = n
    results = [
        CasResult.OK if changed[i] else _refusal(tx, params[i], commit)
        for i, commit in enumerate(commits)
    ]
    _emit_committed(tx, commits, encoded, results)
    _count_finished(tx, commits, results)
    settle(tx, commits, results)
    _keep_usage(tx, commits, results)
    return results


def _keep_usage(tx: Tx, commits: Sequence[Commit], results: Sequence[CasResult]) -> None:
    """What each written commit's execution reported (``ctx.usage``), kept for ``spend``: a
    refused one (a zombie's) keeps nothing."""
    for commit, result in zip(commits, results, strict=True):
        if result is CasResult.OK and commit.usage is not None:
            tx.count("INSERT_USAGE", usage_row(commit.lease, None, commit.usage, tx.now))


def _emit_committed(
    tx: Tx, commits: Sequence[Commit], encoded: Sequence[Params], results: Sequence[CasResult]
) -> None:
    for commit, params, result in zip(commits, encoded, results, strict=True):
        if result is CasResult.OK and commit.kind != "fail":
            committed(tx, commit, params)


def _count_finished(tx: Tx, commits: Sequence[Commit], results: Sequence[CasResult]) -> None:
    """The runs that finishes ended, counted in the same transaction (``totals``)."""
    finished = [c for c, r in zip(commits, results, strict=True)
                if c.kind == "finish" and r is CasResult.OK]  # fmt: skip
    counted(tx, [(c.lease.queue, "succeeded", 1) for c in finished])
    ended_children(tx, [c.lease.run_id for c in finished if c.lease.parent_id is not None])


def _one_step_each_of_another_run(commits: Sequence[Commit]) -> bool:
    runs: set[int] = set()
    for commit in commits:
        if commit.kind not in ONE_STEP or commit.lease.run_id in runs:
            return False
        runs.add(commit.lease.run_id)
    return True


def apply(tx: Tx, commit: Commit, encoded: Params) -> CasResult:
    """One commit under its lease."""
    params = {**encoded, **fence(commit.lease, tx.now)}
    kind = commit.kind
    step = ONE_STEP.get(kind)
    if step is not None:  # the hot path: the fence rides in the step itself
        return CasResult.OK if tx.count(step, params) else _refusal(tx, params, commit)
    if kind in ("wait", "spawn"):  # an advance whose next task is not due, then the wait (B14)
        if not tx.count("ADVANCE", params):
            return _refusal(tx, params, commit)
        return wait(tx, params) if kind == "wait" else spawn(tx, params, commit.children)
    if tx.one("CHECK_FENCE", params) is None:
        rejected(tx, params, kind, commit.lease.task)
        return CasResult.LEASE_LOST
    if kind == "drop":
        tx.count("TASK_DONE", params)
        return CasResult.OK
    if kind in ("retry_after", "park"):  # a release after the delay that spends no attempt
        tx.count("RELEASE", params)
        tx.count("UNSPEND", params)
        if kind == "park":  # ... and the run waits for ``resolve`` (B13)
            tx.count("MARK_PARKED", params)
        return CasResult.OK
    if kind == "fail":
        lease = commit.lease
        if fail_run(tx, lease.run_id, lease.queue, params["reason"], params["error"],
                    lease.task, lease.attempt) == 0:  # fmt: skip
            return CasResult.CONFLICT
        attempt_ended(tx, lease.run_id, lease.task_id, "failed", params["error"])
        tx.count("TASK_FAILED", params)
        return CasResult.OK
    raise ValueError(f"unknown commit kind {kind!r}")
