"""Test app of the paid-call tests: every paid call accounted for by an OUTSIDE ledger
(tests/support/paid_ledger.py judges it; tests/chaos/test_paid_chaos.py,
tests/process/test_paid_process.py and scripts/soak_paid.py run it).

Each handler appends JSON lines to the O_APPEND file its payload names (``ledger``), one
``os.write`` each (tests/apps/ledger_app.py's ``note``): ``start`` (with the attempt's
``once_key``), ``bill`` when the paid call's fn begins, ``paid`` when it returns (with the answer
it returns: which attempt paid it, in which process, and a nonce no other call has), and
``once`` with what ``ctx.once`` returned (and whether it was reused). The ledger is written by
the handlers themselves, so it sees calls the database never heard of (a worker killed in fn).
"""

from __future__ import annotations

import os
import random
import secrets
import time
from typing import Any

from apps.ledger_app import NAP, note
from workerproc import App, TaskContext

app = App()


def ids_of(ctx: TaskContext) -> dict[str, Any]:
    return {"run": ctx.run_id, "task": ctx.task_id, "attempt": ctx.attempt}


def answer_of(ctx: TaskContext) -> dict[str, Any]:
    """What the provider answers: who paid for it, and a nonce no other call returns."""
    return {"by": ctx.attempt, "pid": os.getpid(), "nonce": secrets.token_hex(8)}


def work(ctx: TaskContext, seconds: float) -> None:
    """What the step does with its answer: short naps with a lease check between them."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(NAP, left))
        ctx.raise_if_lost()


@app.task(max_attempts=20)
def pay(ctx: TaskContext) -> None:
    """One paid call (``charge``, ``call`` seconds: low and high) that kill+pause chaos may
    strike anywhere: before it, in fn, in the keep, or in the ``work`` after it."""
    payload = ctx.payload
    path, ids = str(payload["ledger"]), ids_of(ctx)
    rng = random.Random(ctx.task_id * 1000 + ctx.attempt)
    request = {"model": "m", "prompt": f"run {ctx.run_id}"}
    note(path, "start", {**ids, "key": ctx.once_key("charge", request)})
    call_low, call_high = payload["call"]

    def charge() -> dict[str, Any]:
        note(path, "bill", ids)
        time.sleep(rng.uniform(call_low, call_high))
        answer = answer_of(ctx)
        note(path, "paid", {**ids, "answer": answer})
        return answer

    answer = ctx.once("charge", request, charge)
    assert ctx.last_once is not None
    note(path, "once", {**ids, "answer": answer, "reused": ctx.last_once.reused})
    work(ctx, rng.uniform(*payload["work"]))
    ctx.finish({"answer": answer}, result=answer["nonce"])


@app.task(max_attempts=5)
def park(ctx: TaskContext) -> None:
    """``unknown="park"``: the first attempt's process dies inside fn (an intent without an
    answer); the next attempt parks the run instead of calling again."""
    path, ids = str(ctx.payload["ledger"]), ids_of(ctx)
    request = {"amount": 100, "run": ctx.run_id}
    note(path, "start", {**ids, "key": ctx.once_key("charge", request)})

    def charge() -> dict[str, Any]:
        note(path, "bill", ids)
        if ctx.attempt == 1:
            os._exit(9)  # the worker dies in the call: was it paid? nobody knows
        answer = answer_of(ctx)
        note(path, "paid", {**ids, "answer": answer})
        return answer

    answer = ctx.once("charge", request, charge, unknown="park")
    assert ctx.last_once is not None
    note(path, "once", {**ids, "answer": answer, "reused": ctx.last_once.reused})
    ctx.finish({"answer": answer})


@app.task(max_attempts=3)
def cut(ctx: TaskContext) -> None:
    """PostgreSQL: fn's last act terminates the connection its keep is about to use (this slot
    thread's connection of the worker's paid-call store), from a connection of its own; the
    first attempt then fails after ``once`` returned, so the next attempt must reuse."""
    import psycopg  # noqa: PLC0415 - PostgreSQL only

    path, ids = str(ctx.payload["ledger"]), ids_of(ctx)
    request = {"prompt": f"run {ctx.run_id}"}

    def charge() -> dict[str, Any]:
        note(path, "bill", ids)
        answer = answer_of(ctx)
        book = ctx._calls  # the worker's paid calls: this thread's connection is the keep's
        assert book is not None
        conn = book.store().dialect._local.conn  # type: ignore[attr-defined]
        backend = conn.info.backend_pid
        with psycopg.connect(str(ctx.payload["admin"]), autocommit=True) as admin:
            row = admin.execute("SELECT pg_terminate_backend(%s, 5000)", (backend,)).fetchone()
        note(path, "cut", {**ids, "backend": backend, "terminated": bool(row and row[0])})
        note(path, "paid", {**ids, "answer": answer})
        return answer

    answer = ctx.once("charge", request, charge)
    assert ctx.last_once is not None and ctx._calls is not None
    conn = ctx._calls.store().dialect._local.conn  # type: ignore[attr-defined]
    note(path, "once", {**ids, "answer": answer, "reused": ctx.last_once.reused,
                        "backend": conn.info.backend_pid})  # fmt: skip
    if ctx.attempt == 1:
        raise ConnectionError("cut off after the call")  # the next attempt reuses the answer
    ctx.finish({"answer": answer})
