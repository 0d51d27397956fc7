"""``supervisor events``: the outbox (docs/protocol.md B18), every transition of every run in
commit order, listed from an id on or followed as it grows."""

from __future__ import annotations

import json
from collections.abc import Iterable

import click

from workerproc.store import Event

from ..errors import SupervisorError
from ..loop.pinned import PinnedFile
from ..loop.storegate import db_file
from ..operations import actions, render
from .clickutil import RUN_ID, Number, db_option, json_option, option

EVENT_ID = Number(int, 0, 2**63 - 1)


@click.command()
@db_option
@option("--after", type=EVENT_ID, default=0, metavar="ID",
        help="only events after this id (0: from the first)")  # fmt: skip
@option("--follow", is_flag=True, help="keep printing new events as they commit (Ctrl-C stops)")
@option("--run", "run_id", type=RUN_ID, metavar="RUN", help="only this run's events")
@option("--limit", type=Number(int, 1, 10_000), default=1000, metavar="N",
        help="without --follow: print at most N events (default 1000)")  # fmt: skip
@option("--all", "all_", is_flag=True,
        help="the system's own runs' events too (the webhooks' deliveries)")  # fmt: skip
@json_option
def events(
    db: str, after: int, follow: bool, run_id: int | None, limit: int, all_: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Run transitions in commit order: enqueued, claimed, taken over, committed, released,
    handed back, refused writes, succeeded, failed, cancelled (of the system's own runs too
    with --all or their --run). With --json, one JSON object per line."""
    with actions.store_for(db) as store:
        if not follow:
            show(store.events(after=after, limit=limit, run=run_id, system=all_), as_json)
            return
        # the file it opened, as ``start`` pins it (``loop.pinned``): an open connection goes
        # on reading a deleted file, and a new file at the path is another database
        pinned = PinnedFile(db_file(db))
        try:
            pinned.pin()
        except FileNotFoundError:
            raise SupervisorError(f"database {pinned.path} does not exist") from None

        def watch() -> None:
            problem = pinned.problem("`events --follow`")
            if problem is not None:  # one line, exit 1, as ``start`` stops (``loop.guard``)
                raise SupervisorError(f"{problem}: stopping (a new file at that path is "
                                      "never taken for this one)")  # fmt: skip

        try:
            for event in store.follow(after=after, run=run_id, system=all_, watch=watch):
                show([event], as_json)
        except KeyboardInterrupt:  # the way to stop following: no error
            return


def show(found: Iterable[Event], as_json: bool) -> None:
    for e in found:
        if as_json:
            doc = {"id": e.id, "at": e.at, "run_id": e.run_id, "kind": e.kind, "task": e.task,
                   "attempt": e.attempt, "data": e.data}  # fmt: skip
            click.echo(json.dumps(doc, sort_keys=True))
            continue
        data = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(e.data.items()))
        head = f"{e.id:>8}  {render.when(e.at)}  run {e.run_id}  {e.kind:<17}"
        task = f"  {e.task}" + (f"#{e.attempt}" if e.attempt is not None else "") if e.task else ""
        click.echo(f"{head}{task}{'  ' + data if data else ''}", nl=True)


ALL = [events]
