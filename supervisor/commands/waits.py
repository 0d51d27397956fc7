"""Commands for runs that wait: ``signal`` resumes a run's wait."""

from __future__ import annotations

import click

from workerproc.store.codec import MAX_PAYLOAD

from ..operations import actions
from .clickutil import RUN_ID, Name, db_option, option


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.argument("name", type=Name("signal name"))
@db_option
@option("--payload", default="null", metavar="JSON", help="the signal's payload (JSON)")
def signal(run_id: int, name: str, db: str, payload: str) -> None:
    """Send signal NAME to RUN: it resumes the run's wait for NAME (ctx.wait_for), now or when
    it next waits for it; a finished or unknown run is an error."""
    data = actions.parse_json(payload, "--payload", MAX_PAYLOAD)
    with actions.store_for(db) as store:
        signal_id = store.signal(run_id, name, data)
        kept = [x for x in store.run_signals(run_id, limit=1000) if x.id == signal_id]
    taken = not kept or kept[0].task_id is not None
    click.echo(f"signal {signal_id} sent to run {run_id}"
               + ("" if taken else f" (kept until it waits for {name!r})"))  # fmt: skip


ALL = [signal]
