"""SQLite's catalogue: every name of the protocol's vocabulary (``store.dialect.STATEMENTS``),
as one statement of ``sql``/``reads_sql`` or as a step below, where one logical step is several
statements here (SQLite has no writable CTEs) or its parameters go in another shape (lists as
JSON arrays). Steps read their statements from the modules at each call, and run them on the
transaction's connection itself (the hot path: no Python frame between). The completions and
the other steps that end or give back a lease are in ``completions``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..codec import names_json
from ..dialect import ClaimRow, Params, Row, Step, catalogue
from ..limits import WRITTEN, split_gate
from . import calls_sql as c
from . import events_sql as e
from . import ops_sql as o
from . import reads_sql as r
from . import schedules_sql as sc
from . import sql as q
from . import streams_sql as st
from . import waits_sql as w
from . import webhooks_sql as wh
from .completions import (
    ack,
    advance,
    finish,
    handback,
    release,
    retry_tasks,
    set_state,
    task_failed,
)

if TYPE_CHECKING:
    from .dialect import SQLiteTx


def _claim_rows(tx: SQLiteTx, found: list[Row], now: float, gated: bool = False) -> list[Row]:
    """A claim's rows (``ClaimRow``), in task id order: each the statement's own columns (the
    lease's task, its counts, its expiry and whether it was taken over), the claim's "now",
    then what ``RUN_STATES`` reads of every leased task in one statement: the task's name and
    payload, the run's state, revision and queue, the task's declared options, its signal, the
    run's parent and join task; and (a gated claim's, ``gated``: the statement's columns past
    the eighth) the lease's gates, its reservation and what the lease it took over gives back."""
    if not found:
        return []
    found = sorted(found)
    ids = _encode([row[0] for row in found])
    read = {row[0]: row[1:] for row in tx.conn.execute(q.RUN_STATES, {"task_ids": ids})}
    rows: list[Row] = []
    for row in found:
        task_id, run_id, _, _, attempts, base, expires_at, takeover = row[:8]
        (name, payload, state, revision, queue, options, signal_id, parent_id, join_task,
         traceparent, version) = read[task_id]  # fmt: skip
        gate_a, gate_b, gate_c, reserved, given_back = row[8:] if gated else (None,) * 5
        rows.append(ClaimRow(task_id, run_id, name, payload, attempts, base, expires_at,
                             takeover, now, state, revision, queue, options, signal_id,
                             parent_id, join_task, gate_a, gate_b, gate_c, reserved,
                             traceparent, given_back, version))  # fmt: skip
    return rows


def _claimed(tx: SQLiteTx, statement: str, params: Params) -> list[Row]:
    """A claim's rows (``ClaimRow``), in task id order."""
    now, tasks = params["now"], params.get("tasks")
    params = {**params, "tasks": None if tasks is None else names_json(tasks)}
    return _claim_rows(tx, tx.conn.execute(statement, params).fetchall(), now)


def claim(tx: SQLiteTx, params: Params) -> list[Row]:
    return _claimed(tx, q.CLAIM, params)


def claim_queues(tx: SQLiteTx, params: Params) -> list[Row]:
    return _claimed(tx, q.CLAIM_QUEUES, {**params, "queues": names_json(params["queues"])})


def claim_others(tx: SQLiteTx, params: Params) -> list[Row]:
    return _claimed(tx, q.CLAIM_OTHERS, {**params, "skip": names_json(params["skip"])})


def claim_task(tx: SQLiteTx, params: Params) -> list[Row]:
    """A batch's claim: one task's runs (``CLAIM_TASK``)."""
    queues = params["queues"]
    named = None if queues is None else names_json(queues)
    return _claimed(
        tx, q.CLAIM_TASK, {**params, "skip": names_json(params["skip"]), "queues": named}
    )


def renew_many(tx: SQLiteTx, params: Params) -> list[Row]:
    """Each lease of the batch renewed in turn (in process, a statement costs no round trip;
    the protocol records each lease it did not renew as refused)."""
    execute, starting = tx.conn.execute, set(params["starting"])
    shared = {"owner": params["owner"], "ttl": params["ttl"], "now": params["now"]}
    rows: list[Row] = []
    for lease in params["leases"]:
        found = execute(q.RENEW, {**shared, "run_id": lease.run_id, "task_id": lease.task_id,
                                  "attempt": lease.attempt,
                                  "start": lease.task_id in starting}).fetchone()  # fmt: skip
        if found is not None:
            rows.append(found)
    return rows


def insert_runs(tx: SQLiteTx, params: Params) -> list[Row]:
    """Each run (``NewRun``), its first task and its ``run.enqueued`` event (B18), one after
    the other: ``(id, True)``, or ``(0, False)`` where the run's key is taken (nothing
    inserted)."""
    rows: list[Row] = []
    events: list[tuple[object, ...]] = []
    now = params["now"]
    for run in params["runs"]:
        new = {"state": run.state, "name": run.task, "queue": run.queue,
               "priority": run.priority, "key": run.key, "now": now,
               "traceparent": run.traceparent}  # fmt: skip
        row = tx.conn.execute(q.INSERT_SYSTEM_RUN if run.system else q.INSERT_RUN, new).fetchone()
        if row is None:
            rows.append((0, False))
            continue
        first = {"run_id": row[0], "name": run.task, "payload": run.payload, "delay": run.delay,
                 "state": run.state, "queue": run.queue, "version": run.version,
                 **run.gating.params()}  # fmt: skip
        tx.conn.execute(q.INSERT_TASK, {**first, "now": now})
        enqueued = {"queue": run.queue, "key": run.key, "delay": run.delay or None}
        data = _encode({k: v for k, v in enqueued.items() if v is not None})
        events.append((now, row[0], "run.enqueued", run.task, None, data))
        rows.append((row[0], True))
    tx.conn.executemany(e.INSERT_EVENT, events)  # in the runs' order, after them
    return rows


_encode = json.JSONEncoder(separators=(",", ":")).encode


def find_by_keys(tx: SQLiteTx, params: Params) -> list[Row]:
    rows = (
        (key, tx.conn.execute(q.FIND_BY_KEY, {"key": key}).fetchone()) for key in params["keys"]
    )
    return [(key, row[0]) for key, row in rows if row is not None]


def next_ready_queues(tx: SQLiteTx, params: Params) -> list[Row]:
    return tx.conn.execute(r.NEXT_READY_QUEUES, {"queues": json.dumps(params["queues"])}).fetchall()


def claim_runs(tx: SQLiteTx, params: Params) -> list[Row]:
    """CLAIM_RUNS for the admitted runs, each a claim's row (``ClaimRow``) with its gates, its
    reservation and what its predecessor's reservation gives back."""
    found = tx.conn.execute(q.CLAIM_RUNS, {**params, "run_ids": json.dumps(params["run_ids"])})
    return _claim_rows(tx, found.fetchall(), params["now"], gated=True)


def line_runs(tx: SQLiteTx, params: Params) -> list[Row]:
    """The first ``limit`` claimable runs of each line of ``lines``, the line first: one
    statement for them all (the lines, queues and tasks as JSON arrays)."""
    queues, tasks = params["queues"], params.get("tasks")
    shaped = {**params, "lines": json.dumps(params["lines"]),
              "queues": None if queues is None else names_json(queues),
              "tasks": None if tasks is None else names_json(tasks)}  # fmt: skip
    return tx.conn.execute(q.LINE_RUNS, shaped).fetchall()


def gate_state(tx: SQLiteTx, params: Params) -> list[Row]:
    """Each gate of ``gates`` that exists, with its numbers, buckets and live leases: one
    statement for them all."""
    shaped = {"gates": json.dumps(params["gates"]), "now": params["now"]}
    return tx.conn.execute(q.GATE_STATE, shaped).fetchall()


def gate_write(tx: SQLiteTx, params: Params) -> list[Row]:
    """What a claim made of its gates (``limits.gate_writes``: a list per column), one
    ``executemany`` of WRITE_GATE (one prepared statement, no Python between the rows)."""
    gates = params["gate"]
    columns = [(name, params[name]) for name in WRITTEN]
    each = [{name: values[i] for name, values in columns} for i in range(len(gates))]
    tx.conn.executemany(q.WRITE_GATE, each)
    return [(gate,) for gate in gates]


def _then(write: str, then: str, key: str, *, if_changed: bool = False) -> Step:
    """A step that is ``write``, then ``then`` (only when ``write`` changed a row, with
    ``if_changed``), and answers a row (``params[key]``) per row ``write`` changed."""

    def step(tx: SQLiteTx, params: Params) -> list[Row]:
        changed = tx.conn.execute(write, params).rowcount
        if changed or not if_changed:
            tx.conn.execute(then, params)
        return [(params[key],)] * changed

    return step


# a limit's new numbers, then its gates reopened (they may admit more now)
set_limit = _then(q.SET_LIMIT_NUMBERS, q.REOPEN_LIMIT, "name")
# a gate settled (a commit gave its slot back), then the runs blocked behind it reopened
gate_settle = _then(q.SETTLE_GATE, q.REOPEN_BLOCKED, "gate")
# a stream's batch, then its head moved past it (one statement on PostgreSQL)
stream_move = _then(st.STREAM_APPEND, st.STREAM_MOVE, "run_id")
stream_moved = _then(st.STREAM_APPEND, st.STREAM_MOVED, "run_id")


def place_gates(tx: SQLiteTx, params: Params) -> list[Row]:
    for gate in params["gates"]:
        lim, key = split_gate(gate)
        tx.conn.execute(q.NEW_GATE, {"gate": gate, "lim": lim, "key": key, "now": params["now"]})
    for line in params["lines"]:
        tx.conn.execute(q.LINE_JOINED, {"gate": line, "now": params["now"]})
    return [(g,) for g in params["lines"]]


# the owner's live leases expire now; the gates they held slots of may admit again
release_owner = _then(q.EXPIRE_OWNER, q.REOPEN_OWNER_GATES, "owner", if_changed=True)
# a task's gates written again, then its run placed (in a line, or claimable)
regate = _then(q.REGATE_TASK, q.PLACE_RUN, "task_id")


def insert_events(tx: SQLiteTx, params: Params) -> list[Row]:
    """The transaction's events (``protocol.events``), each its own row, at its "now"."""
    now = params["now"]
    rows = [(now, ev["run_id"], ev["kind"], ev["task"], ev["attempt"], ev["data"])
            for ev in params["events"]]  # fmt: skip
    tx.conn.executemany(e.INSERT_EVENT, rows)
    return []


def deliver_signal(tx: SQLiteTx, params: Params) -> list[Row]:
    """The oldest kept signal of the name the run waits for, delivered to its waiting task
    (due now); none when the run waits for no signal it has."""
    execute = tx.conn.execute
    found = execute(w.WAITING_SIGNAL, params).fetchone()
    if found is None:
        return []
    task_id, signal_id = found
    ids = {"task_id": task_id, "signal_id": signal_id, "now": params["now"]}
    execute(w.SIGNAL_TAKEN, ids)
    execute(w.SIGNAL_TASK_DUE, ids)
    execute(w.WAIT_OVER, params)
    return [(task_id, signal_id)]


def unpark(tx: SQLiteTx, params: Params) -> list[Row]:
    """A run parked on a call (B13) goes on: its task is due now, and it waits no more."""
    rows: list[Row] = tx.conn.execute(c.UNPARK_TASK, params).fetchall()
    if rows:
        tx.conn.execute(c.UNPARKED, params)
    return rows


def link_children(tx: SQLiteTx, params: Params) -> list[Row]:
    """Each child knows its parent, the join task and its place; the parent its count."""
    execute, parent = tx.conn.execute, params["parent"]
    row = execute(w.LINK_PARENT, {"parent": parent, "n": len(params["children"])}).fetchone()
    for ord_, child in enumerate(params["children"]):
        execute(w.LINK_CHILD, {"parent": parent, "join_task": row[0], "ord": ord_,
                               "child": child})  # fmt: skip
    return [(child,) for child in params["children"]]


def child_ended(tx: SQLiteTx, params: Params) -> list[Row]:
    """A run ended: if it is a child, its parent waits for one less; the last makes the
    parent's join task due and ends its wait. A row: the parent whose join is due."""
    execute = tx.conn.execute
    found = execute(w.PARENT_OF, params).fetchone()
    if found is None:
        return []
    ids = {"parent": found[0], "join_task": found[1], "now": params["now"]}
    left = execute(w.CHILD_LEFT, ids).fetchone()
    if left is None or left[0] != 0:
        return []
    execute(w.JOIN_TASK_DUE, ids)
    execute(w.WAIT_OVER, {"run_id": found[0]})
    return [(found[0],)]


def join_due(tx: SQLiteTx, params: Params) -> list[Row]:
    changed = tx.conn.execute(w.JOIN_DUE, params).rowcount
    tx.conn.execute(w.WAIT_OVER, params)
    return [(params["run_id"],)] * changed


def head_tasks(tx: SQLiteTx, params: Params) -> list[Row]:
    shaped = {**params, "run_ids": json.dumps(params["run_ids"])}
    return tx.conn.execute(r.HEAD_TASKS, shaped).fetchall()


def pending_ids(tx: SQLiteTx, params: Params) -> list[Row]:
    queues = params["queues"]
    shaped = {**params, "queues": None if queues is None else json.dumps(queues)}
    return tx.conn.execute(r.PENDING_IDS, shaped).fetchall()


STEPS: dict[str, Step] = {
    "INSERT_EVENTS": insert_events,
    "DELIVER_SIGNAL": deliver_signal,
    "UNPARK": unpark,
    "LINK_CHILDREN": link_children,
    "CHILD_ENDED": child_ended,
    "JOIN_DUE": join_due,
    "CLAIM": claim,
    "CLAIM_QUEUES": claim_queues,
    "CLAIM_OTHERS": claim_others,
    "CLAIM_TASK": claim_task,
    "RENEW_MANY": renew_many,
    "FINISH": finish,
    "ADVANCE": advance,
    "RELEASE": release,
    "HANDBACK": handback,
    "TASK_FAILED": task_failed,
    "RETRY_TASKS": retry_tasks,
    "ACK": ack,
    "SET_STATE": set_state,
    "INSERT_RUNS": insert_runs,
    "FIND_BY_KEYS": find_by_keys,
    "NEXT_READY_QUEUES": next_ready_queues,
    "CLAIM_RUNS": claim_runs,
    "LINE_RUNS": line_runs,
    "GATE_STATE": gate_state,
    "GATE_WRITE": gate_write,
    "SET_LIMIT": set_limit,
    "GATE_SETTLE": gate_settle,
    "PLACE_GATES": place_gates,
    "RELEASE_OWNER": release_owner,
    "REGATE": regate,
    "HEAD_TASKS": head_tasks,
    "PENDING_IDS": pending_ids,
    "STREAM_MOVE": stream_move,
    "STREAM_MOVED": stream_moved,
}
CATALOGUE = catalogue([q, o, r, c, sc, e, w, wh, st], STEPS)
