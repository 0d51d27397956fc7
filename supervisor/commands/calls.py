"""Paid calls (issue 27): ``supervisor forget RUN NAME`` drops a run's kept answers of one call,
so its step's next attempt pays for a fresh one; ``show`` lists them (``calls_table``)."""

from __future__ import annotations

import click

from workerproc.store.calls import PaidCall

from . import render, store_actions
from .clickutil import RUN_ID, Name, db_option


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.argument("name", metavar="NAME", type=Name("a call's name"))
@db_option
def forget(run_id: int, name: str, db: str) -> None:
    """Drop RUN's kept answers of the call NAME (``ctx.once``): the next attempt pays afresh."""
    with store_actions.store_for(db) as store:
        gone = store.forget_call(run_id, name)
    click.echo(f"run {run_id}: forgot {gone} paid call(s) named {name!r}")


def calls_table(calls: list[PaidCall]) -> str:
    rows = [[c.task_id, c.name, c.request_hash[:12], c.attempt, c.tokens, c.outcome,
             render.when(c.at)] for c in calls]  # fmt: skip
    headers = ["task", "call", "request", "paid by", "tokens", "outcome", "kept"]
    return render.table(headers, rows)


ALL = [forget]
