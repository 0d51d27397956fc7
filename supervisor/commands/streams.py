"""``supervisor stream``: a run's stream (docs/protocol.md B21), the chunks its steps' handlers
emitted, printed from an offset on, or followed while the run goes on."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable

import click

from workerproc.store import RunNotFound, StoreError, open_async_store
from workerproc.store.streams import Chunk

from ..errors import SupervisorError
from ..loop.storegate import db_file
from ..operations import actions
from .clickutil import RUN_ID, Number, db_option, json_option, option

OFFSET = Number(int, 0, 2**63 - 1)
PAGE = 1000  # chunks read at a time


@click.command()
@db_option
@click.argument("run_id", type=RUN_ID, metavar="RUN")
@option("--after", type=OFFSET, default=0, metavar="N",
        help="only the chunks after this offset (0: from the first)")  # fmt: skip
@option("--follow", is_flag=True,
        help="keep printing new chunks as they are written, until the run is over "
             "(Ctrl-C stops)")  # fmt: skip
@json_option
def stream(db: str, run_id: int, after: int, follow: bool, as_json: bool) -> None:
    """The chunks run RUN's steps emitted (ctx.emit), in order. Text chunks are printed as
    they are, one after the other; a reset (a new attempt of a step took over: what its earlier
    attempt wrote is void) is said on a line of its own. With --json, one JSON object per line
    (offset, attempt, step, kind, data, at)."""
    with actions.store_for(db) as store:
        if store.get_run(run_id) is None:
            raise SupervisorError(f"run {run_id} not found")
        if not follow:
            cursor = after
            while chunks := store.stream(run_id, cursor, PAGE):
                show(chunks, as_json)
                cursor = chunks[-1].offset
            end(as_json)
            return
    try:
        asyncio.run(_follow(db, run_id, after, as_json))
    except KeyboardInterrupt:  # the way to stop following: no error
        return
    except RunNotFound:
        raise SupervisorError(f"run {run_id} not found") from None
    except StoreError as exc:
        raise SupervisorError(str(exc)) from None
    end(as_json)


async def _follow(db: str, run_id: int, after: int, as_json: bool) -> None:
    """The run's chunks as they are written (PostgreSQL: LISTEN), until it is over."""
    # the database was found by ``store_for``; a reader never creates a PostgreSQL schema
    store = await (open_async_store(db) if db_file(db) is not None
                   else open_async_store(db, migrate=False))  # fmt: skip
    try:
        async for chunk in store.follow_stream(run_id, after):
            show([chunk], as_json)
    finally:
        await store.close()


def show(chunks: Iterable[Chunk], as_json: bool) -> None:
    for c in chunks:
        if as_json:
            click.echo(json.dumps(c.as_json(), sort_keys=True))
        elif c.kind == "reset":
            click.echo(f"\n[reset: attempt {c.attempt} of step {c.step} starts over]", err=False)
        elif isinstance(c.data, str):
            click.echo(c.data, nl=False)
        else:
            click.echo(json.dumps(c.data, sort_keys=True))
    sys.stdout.flush()


def end(as_json: bool) -> None:
    """Text ends with a newline (a chunk's text may not)."""
    if not as_json:
        click.echo("")


ALL = [stream]
