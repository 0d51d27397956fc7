"""PostgreSQL's catalogue: every name of the protocol's vocabulary (``store.dialect.STATEMENTS``),
as one statement of ``sql``/``reads_sql`` or as a step below: where the statement's text
depends on its parameters (the claim of N named queues), where its parameters go as arrays (the
leases of ``RENEW_MANY``), where the run rows are locked by a statement of their own first
(``RELEASE_OWNER``), where the caller's own connection needs our schema named (transactional
enqueue), or where one statement takes a batch of commits (``Each``). Steps read their
statements at each call."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from ..dialect import ClaimRow, Params, Row, Shaped, Step, catalogue
from ..limits import split_gate
from ..records import record
from . import batch_sql as b
from . import calls_sql as c
from . import events_sql as e
from . import floors
from . import gates_sql as g
from . import ops_sql as o
from . import reads_sql as r
from . import schedules_sql as sc
from . import sql as q
from . import streams_sql as st
from . import waits_sql as w
from . import webhooks_sql as wh

if TYPE_CHECKING:
    from .tx import PostgresTx


def _claim(tx: PostgresTx, queues: int | None, params: Params, skip: bool = False) -> list[Row]:
    limit, served = params["limit"], params.get("tasks") is not None
    text = q.claim_sql(queues, limit if 0 < limit <= q.MAX_CLAIM_TEXTS else None, skip, served)
    scope = None if queues is None else tuple(params["queues"])
    params = {**params, "floor": floors.floor(tx, scope)}  # where the walk starts
    return [ClaimRow._make(row) for row in tx.execute(text, params)]


def claim_runs(tx: PostgresTx, params: Params) -> list[Row]:
    """The admitted runs of a gated claim leased (``CLAIM_RUNS``), in the claim's rows."""
    return [ClaimRow._make(row) for row in tx.execute(q.CLAIM_RUNS, params)]


def claim(tx: PostgresTx, params: Params) -> list[Row]:
    """The claim for every queue, its limit written into its text (``sql.claim_sql``)."""
    return _claim(tx, None, params)


def claim_queues(tx: PostgresTx, params: Params) -> list[Row]:
    """The claim for the named queues (no name twice): one walk per queue."""
    return _claim(tx, len(params["queues"]), params)


def claim_others(tx: PostgresTx, params: Params) -> list[Row]:
    """The claim for every queue but those of ``skip``."""
    return _claim(tx, None, params, skip=True)


def claim_task(tx: PostgresTx, params: Params) -> list[Row]:
    """A batch's claim: one task's runs (``CLAIM_TASK``)."""
    scope = None if params.get("queues") is None else tuple(params["queues"])
    params = {**params, "floor": floors.floor(tx, scope)}  # where the walk starts
    return [ClaimRow._make(row) for row in tx.execute(q.CLAIM_TASK, params)]


def next_ready(tx: PostgresTx, params: Params) -> list[Row]:
    """``NEXT_READY``: from the floor of every queue, as the claim walks (``floors``)."""
    params = {**params, "floor": floors.floor(tx, None)}
    rows: list[Row] = tx.execute(r.NEXT_READY, params).fetchall()
    return rows


def next_ready_queues(tx: PostgresTx, params: Params) -> list[Row]:
    """``NEXT_READY_QUEUES``: from the floor of its queues, as the claim walks (``floors``)."""
    scope = tuple(params["queues"])
    params = {**params, "floor": floors.floor(tx, scope)}
    rows: list[Row] = tx.execute(r.NEXT_READY_QUEUES, params).fetchall()
    return rows


def renew_many(tx: PostgresTx, params: Params) -> list[Row]:
    """Every lease in one statement, as arrays; it locks the runs in id order itself (the
    protocol records each refusal)."""
    leases, starting = params["leases"], set(params["starting"])
    arrays = {
        "task_ids": [lease.task_id for lease in leases],
        "attempts": [lease.attempt for lease in leases],
        "runs": [lease.run_id for lease in leases],
        "starts": [lease.task_id in starting for lease in leases],
        "run_ids": sorted({lease.run_id for lease in leases}),
        "owner": params["owner"],
        "ttl": params["ttl"],
        "now": params["now"],
    }
    rows: list[Row] = tx.execute(q.RENEW_MANY, arrays).fetchall()
    return rows


def release_owner(tx: PostgresTx, params: Params) -> list[Row]:
    """The owner's runs locked in id order, then its live leases expired: one row each."""
    tx.execute(o.LOCK_OWNER_RUNS, params)
    rows: list[Row] = tx.execute(o.RELEASE_OWNER, params).fetchall()
    return rows


@cache
def _qualified(template: str, prefix: str, channel: str = "") -> str:
    return template.format(s=prefix, channel=channel)


def _insert_runs_shape(params: Params) -> Params:
    """Every run of the batch (``NewRun``) in one statement, each column an array."""
    runs = params["runs"]
    return {
        "states": [r.state for r in runs],
        "tasks": [r.task for r in runs],
        "payloads": [r.payload for r in runs],
        "delays": [r.delay for r in runs],
        "keys": [r.key for r in runs],
        "queues": [r.queue for r in runs],
        "priorities": [r.priority for r in runs],
        "lines": [r.gating.line for r in runs],
        "gates_a": [r.gating.params()["gate_a"] for r in runs],
        "gates_b": [r.gating.params()["gate_b"] for r in runs],
        "gates_c": [r.gating.params()["gate_c"] for r in runs],
        "tokens": [r.gating.tokens for r in runs],
        "traceparents": [r.traceparent for r in runs],
        "systems": [r.system for r in runs],
        "versions": [r.version for r in runs],
        "now": params["now"],
    }


def _insert_runs(prefix: str) -> str:
    """INSERT_RUNS for a schema prefix: on the caller's connection (``"schema".``) our names
    qualified and our notification channel spelt out (its search path is not our schema)."""
    if not prefix:
        return o.INSERT_RUNS
    schema = prefix[1:-2].replace('""', '"')
    channel = "'" + f"leasekeeper.{schema}".replace("'", "''") + "'"
    return _qualified(o._INSERT_RUNS, prefix, channel)


# names qualified on the caller's connection (transactional enqueue); the async store runs these
# two steps itself (``Shaped``)
insert_runs = Shaped(_insert_runs, _insert_runs_shape)
find_by_keys = Shaped(lambda prefix: _qualified(o._FIND_BY_KEYS, prefix), lambda p: p)
key_run = Shaped(lambda prefix: _qualified(o._KEY_RUN, prefix), lambda p: p)
debounce_run = Shaped(lambda prefix: _qualified(o._DEBOUNCE_RUN, prefix), lambda p: p)
release_key = Shaped(lambda prefix: _qualified(o._RELEASE_KEY, prefix), lambda p: p)


def _insert_events_shape(params: Params) -> Params:
    """The transaction's events (``protocol.events``) as one array literal per column (their
    data is JSON text already: it goes in as it is). Written here as text: the driver's own
    arrays cost the client three times the CPU of the whole statement's values."""
    events = params["events"]
    return {
        "run_ids": _array([x["run_id"] for x in events]),
        "kinds": _array([x["kind"] for x in events]),
        "tasks": _array([x["task"] for x in events]),
        "attempts": _array([x["attempt"] for x in events]),
        "datas": _array([x["data"] for x in events]),
        "now": params["now"],
    }


def _array(values: list[object]) -> str:
    """A PostgreSQL array literal of ``values`` (None: NULL; every other value quoted, its
    backslashes and double quotes escaped), for a ``::type[]`` cast."""
    return "{" + ",".join([_element(v) for v in values]) + "}"


def _element(value: object) -> str:
    if value is None:
        return "NULL"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


# on the caller's connection too (transactional enqueue), so its names take the prefix
insert_events = Shaped(lambda prefix: _qualified(e._INSERT_EVENTS, prefix), _insert_events_shape)


def place_gates(tx: PostgresTx, params: Params) -> list[Row]:
    """PLACE_GATES with each gate's limit and key as arrays beside it."""
    split = [split_gate(g) for g in params["gates"]]
    shaped = {**params, "lims": [x[0] for x in split], "keys": [x[1] for x in split]}
    rows: list[Row] = tx.execute(g.PLACE_GATES, shaped).fetchall()
    return rows


def child_ended(tx: PostgresTx, params: Params) -> list[Row]:
    """A run ended: if it is a child, its parent waits for one less; the last makes the
    parent's join task due (JOIN_DUE). A row: the parent whose join is due."""
    rows: list[Row] = tx.execute(w.CHILD_LEFT, params).fetchall()
    if not rows or rows[0][1] != 0:
        return []
    tx.execute(w.JOIN_DUE, {"run_id": rows[0][0], "now": params["now"]})
    return [(rows[0][0],)]


@record
class Each:
    """A completion of ``batch_sql`` (``FINISH``, ``ADVANCE``, ``RELEASE``, ``HANDBACK``,
    ``SET_STATE``): one statement for N >= 1 commits of distinct runs (``commits``: each one's
    record, ``driver.Completion``, whose fields are the columns), its VALUES list written for
    N (``batch_sql.sized``). Its rows: the runs written."""

    name: str  # of the statement in ``sql`` (read at each call)
    columns: tuple[tuple[str, str], ...]

    def __call__(self, tx: PostgresTx, params: Params) -> list[Row]:
        commits, rows = params["commits"], []
        for at in range(0, len(commits), MAX_BATCH):  # (a statement takes 65,535 values)
            part = commits[at : at + MAX_BATCH]
            values = {
                f"{name}_{k}": getattr(c, name)
                for k, c in enumerate(part)
                for name, _ in self.columns
            }
            values["now"] = params["now"]
            statement = b.sized(getattr(q, self.name), self.columns, len(part))
            rows += tx.execute(statement, values).fetchall()
        return rows


MAX_BATCH = 256  # commits per completion statement; a larger batch is sent in parts


def ack(tx: PostgresTx, params: Params) -> list[Row]:
    """For each commit: the task done (``TASK_DONE``), then its run succeeded if no task is
    left (``SUCCEED_IF_EMPTY``). A row: the run, and whether it ended."""
    rows: list[Row] = []
    for commit in params["commits"]:
        named = commit.params(params["now"])
        if tx.execute(q.TASK_DONE, named).fetchall():
            rows.append((commit.run_id, bool(tx.execute(q.SUCCEED_IF_EMPTY, named).rowcount)))
    return rows


STEPS: dict[str, Step] = {
    "FINISH": Each("FINISH", b.FINISH_COLUMNS),
    "ADVANCE": Each("ADVANCE", b.ADVANCE_COLUMNS),
    "RELEASE": Each("RELEASE", b.RELEASE_COLUMNS),
    "HANDBACK": Each("HANDBACK", b.HANDBACK_COLUMNS),
    "SET_STATE": Each("SET_STATE", b.SET_STATE_COLUMNS),
    "ACK": ack,
    "CHILD_ENDED": child_ended,
    "PLACE_GATES": place_gates,
    "CLAIM": claim,
    "CLAIM_QUEUES": claim_queues,
    "CLAIM_OTHERS": claim_others,
    "CLAIM_TASK": claim_task,
    "CLAIM_RUNS": claim_runs,
    "RENEW_MANY": renew_many,
    "NEXT_READY": next_ready,
    "NEXT_READY_QUEUES": next_ready_queues,
    "RELEASE_OWNER": release_owner,
    "INSERT_RUNS": insert_runs,
    "FIND_BY_KEYS": find_by_keys,
    "KEY_RUN": key_run,
    "DEBOUNCE_RUN": debounce_run,
    "RELEASE_KEY": release_key,
    "INSERT_EVENTS": insert_events,
}
CATALOGUE = catalogue([q, o, g, r, c, sc, e, w, wh, st], STEPS)
