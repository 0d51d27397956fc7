"""``supervisor stream``: a run's stream (docs/protocol.md B21), the chunks its steps' handlers
emitted, printed from an offset on, or followed while the run goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterable

import click

from workerproc.store import RunNotFound, StoreError, open_async_store
from workerproc.store.streams import Chunk

from ..errors import SupervisorError
from ..loop.pinned import PinnedFile
from ..loop.storegate import db_file
from ..operations import actions
from .clickutil import RUN_ID, Number, db_option, json_option, option

OFFSET = Number(int, 0, 2**63 - 1)
PAGE = 1000  # chunks read at a time
WATCH = 1.0  # seconds between two looks at a followed SQLite file


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
    """The run's chunks as they are written (PostgreSQL: LISTEN), until it is over; a SQLite
    file deleted or replaced meanwhile ends it in one line, as ``events --follow`` does (an
    open connection goes on reading a deleted file: its run would never end)."""
    path = db_file(db)
    pinned = PinnedFile(path) if path is not None else None
    if pinned is not None:
        try:
            pinned.pin()
        except FileNotFoundError:
            raise SupervisorError(f"database {pinned.path} does not exist") from None
    # the database was found by ``store_for``; a reader never creates a PostgreSQL schema
    store = await (open_async_store(db) if path is not None
                   else open_async_store(db, migrate=False))  # fmt: skip

    async def printing() -> None:
        async for chunk in store.follow_stream(run_id, after):
            show([chunk], as_json)

    async def guarding() -> None:
        while True:
            await asyncio.sleep(WATCH)
            _watch(pinned)

    tasks = [asyncio.create_task(printing())]
    if pinned is not None:
        tasks.append(asyncio.create_task(guarding()))
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # the follow's end, its error, or the file's problem
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StoreError):
                await task
        await store.close()


def _watch(pinned: PinnedFile | None) -> None:
    problem = pinned.problem("`stream --follow`") if pinned is not None else None
    if problem is not None:
        raise SupervisorError(f"{problem}: stopping (a new file at that path is never taken "
                              "for this one)")  # fmt: skip


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
