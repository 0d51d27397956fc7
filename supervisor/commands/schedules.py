"""``supervisor schedules``: the schedules apps declared in the database, when each
fires next, what it fired last; ``--drop NAME`` forgets one an app no longer declares."""

from __future__ import annotations

import dataclasses
import json

import click

from ..errors import SupervisorError
from ..operations import actions, render
from .clickutil import db_option, json_option, option


@click.command()
@db_option
@option("--drop", default=None, metavar="NAME",
        help="forget schedule NAME (a worker whose app declares it writes it again)")  # fmt: skip
@json_option
def schedules(db: str, drop: str | None, as_json: bool) -> None:
    """The schedules every app declared: cron, time zone, task, next tick, last tick, last
    run and its status, and how many runs each started."""
    with actions.store_for(db) as store:
        if drop is not None:
            if not store.drop_schedule(drop):
                raise SupervisorError(f"no schedule {drop!r} (see 'supervisor schedules')")
            click.echo(f"schedule {drop!r} dropped")
            return
        found = store.schedules()
        now = store.now()
    if as_json:
        docs = [{**dataclasses.asdict(s), "payload": json.loads(s.payload)} for s in found]
        click.echo(render.to_json(docs))
        return
    rows = [
        [s.name, s.cron, s.tz, s.task, s.catch_up, render.when(s.next_at),
         render.relative(s.next_at, now), render.when(s.last_tick), s.last_run,
         s.last_status, s.fired]
        for s in found
    ]  # fmt: skip
    headers = ["name", "cron", "tz", "task", "catch up", "next run", "in", "last tick",
               "last run", "status", "runs"]  # fmt: skip
    click.echo(render.table(headers, rows))


ALL = [schedules]
