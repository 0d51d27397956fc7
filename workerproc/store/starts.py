"""The driver's verbs that a program may ask for (``asks.py``), written once as programs over
the catalogue's statements: ``starting`` (``start_runs``, B7) and ``signalling`` (``signal``,
B14). ``verbs.InTurn`` drives them on a ``dialect.Tx``; a transaction that is not one (the
async store's on PostgreSQL) runs a program through ``in_statements``, which runs each ask
as its verb's program inline. A driver that sends a verb's statements its own way overrides
the verb on its ``Tx``; today both engines send these in turn."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .asks import (
    Answer,
    Ask,
    Program,
    SignalAsk,
    SignalRow,
    Started,
    StartRuns,
    Statement,
    Statements,
)
from .driver import Placing
from .errors import StoreError

if TYPE_CHECKING:
    from .limits import Gating
    from .newrun import NewRun

DEBOUNCE_TRIES = 5  # inserts a debounced start tries, each after its key's run began meanwhile


def starting(ask: StartRuns, now: float | None) -> Statements[list[Started]]:
    """Insert the runs and their first tasks, in the runs' order; a run whose key is taken (by
    a run that exists, or by an earlier run of the same batch) inserts nothing and answers that
    run. ``INSERT_RUNS`` writes each inserted run's ``run.enqueued`` event itself (B18), in the
    same statement on PostgreSQL. A debounced run (``debounced``) first asks its key's run to
    take its payload."""
    runs = ask.runs
    got: list[Started | None] = [None] * len(runs)
    for i, run in enumerate(runs):
        if run.debounce is not None:
            found = yield from debounced(run, now)
            got[i] = None if found is None else Started(found, False)
    for _ in range(DEBOUNCE_TRIES):
        rest = [i for i, found in enumerate(got) if found is None]
        if not rest:
            return [x for x in got if x is not None]
        inserted = yield from _inserted([runs[i] for i in rest], now)
        for i, (run_id, made) in zip(rest, inserted, strict=True):
            # a debounced run whose key another start took meanwhile (an earlier item of the
            # batch, or a producer whose run committed first): that run takes its payload
            if made or runs[i].debounce is None:
                got[i] = Started(run_id, made)
            else:
                found = yield from debounced(runs[i], now)
                got[i] = None if found is None else Started(found, False)
    raise StoreError("a debounced start could not settle on a run (its key kept changing hands)")


def debounced(run: NewRun, now: float | None) -> Statements[int | None]:
    """The key's run takes ``run``'s payload and start (pending, its one task never claimed):
    its id. Else None, and a run of the key that began or ended goes on without it, so the
    insert that follows takes the key. On PostgreSQL ``KEY_RUN`` holds the run first: no claim
    can begin it under the update; ``LOCK_KEY`` makes debounced starts of one key take turns
    (a plain start of the key may still insert first: the caller then tries again)."""
    yield "LOCK_KEY", {"key": run.key}
    rows = yield "KEY_RUN", {"key": run.key}
    if not rows:
        return None
    run_id = int(rows[0][0])
    params = {"run_id": run_id, "payload": run.payload, "delay": run.delay, "now": now}
    if (yield "DEBOUNCE_RUN", params):
        return run_id
    yield "RELEASE_KEY", {"run_id": run_id}
    return None


def _inserted(runs: list[NewRun], now: float | None) -> Statements[list[tuple[int, bool]]]:
    """``INSERT_RUNS``: each run's id and whether it was made (False: its key was taken, the
    id that of the key's run)."""
    rows = yield "INSERT_RUNS", {"runs": runs, "now": now}  # (id, inserted, ...) each
    got = [(int(row[0]), bool(row[1])) for row in rows]
    placed = [r.gating for r, row in zip(runs, rows, strict=True) if row[1] and r.gating.line]
    if placed:  # gated runs joined their lines: each gate exists, each line may admit now
        yield from joined(placing(placed), now)
    taken = [i for i, (_, made) in enumerate(got) if not made]
    if taken:  # keys that name a run already there: the first run's id, nothing created
        keys = [runs[i].key for i in taken]
        found: dict[str | None, int] = dict((yield "FIND_BY_KEYS", {"keys": keys}))
        for i in taken:
            if runs[i].key not in found:
                raise StoreError(f"{runs[i].key!r}: a run with this key was not found")
            got[i] = (int(found[runs[i].key]), False)
    return got


def placing(gatings: Sequence[Gating]) -> Placing:
    """What ``PLACE_GATES`` writes: every gate the runs name (created when new), and the
    lines they joined (each may admit a run now, unless it is closed for a while)."""
    gates = sorted({g for x in gatings for g in x.gates})
    lines = sorted({x.line for x in gatings if x.line})
    return Placing(tuple(gates), tuple(lines))


def place(placement: Placing, now: float | None) -> Statement:
    """``PLACE_GATES``, the one statement of a placement: the gates of ``placement`` created
    when new, and its lines opened (each may admit a run now, unless closed for a while)."""
    return "PLACE_GATES", {"gates": list(placement.gates), "lines": list(placement.lines),
                           "now": now}  # fmt: skip


def joined(placement: Placing, now: float | None) -> Statements[None]:
    """A placement written now (``place``): what a start's gated runs do on joining their
    lines, and a repair of a line whose gate had no row."""
    yield place(placement, now)


def signalling(ask: SignalAsk, now: float | None) -> Statements[SignalRow]:
    """Keep the signal (the run live), then deliver it if the run waits for it now (its task
    due now: its line, if gated, may admit it); nothing kept: the run's status, if any."""
    rows = yield "INSERT_SIGNAL", ask.params(now)
    if not rows:
        found = yield "RUN_STATUS", {"run_id": ask.run_id}
        return SignalRow(None, False, str(found[0][0]) if found else None)
    taken = yield "DELIVER_SIGNAL", {"run_id": ask.run_id, "now": now, "fresh": False}
    if taken:
        yield "REOPEN_RUN", {"run_id": ask.run_id, "now": now}
    return SignalRow(int(rows[0][0]), bool(taken))


# each verb a program may ask for, as its program (``read_events`` is a read: the async store
# sends its statement outside a transaction, ``EventsAsk.statement``)
PROGRAMS: dict[str, Callable[[Any, float | None], Statements[Any]]] = {
    "start_runs": starting,
    "signal": signalling,
}


def in_statements(program: Program[Answer], now: float | None) -> Statements[Answer]:
    """``program`` as statements only: each ask it yields run as its verb's program (for a
    transaction that runs statements but has no verbs: the async store's on PostgreSQL)."""
    try:
        step = next(program)
        while True:
            if isinstance(step, Ask):
                answer = yield from PROGRAMS[step.verb](step, now)
            else:
                answer = yield step
            step = program.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
