"""``supervisor webhooks``: the webhooks every worker delivers (docs/protocol.md B20), each with
its delivery record and dead letters; ``webhooks add`` and ``webhooks remove`` change them for
every host at once."""

from __future__ import annotations

import os
import secrets
import stat
import sys

import click

from workerproc.store import redact_url
from workerproc.store.protocol.events import KINDS
from workerproc.store.webhooks import (
    BACKLOG_MAX,
    MAX_IN_FLIGHT,
    MAX_SECRET,
    RetryNumbers,
    WebhookInfo,
)

from ..errors import ConfigError, SupervisorError
from ..operations import actions, render
from .clickutil import Number, db_opt, group_db, json_option, option
from .events import EVENT_ID

DEAD_SHOWN = 10  # dead letters listed per webhook (--json gives all that are kept)


def lines(infos: list[WebhookInfo], now: float) -> str:
    if not infos:
        return "no webhook (supervisor webhooks add NAME URL)"
    rows = [
        [i.name, i.url, ",".join(i.kinds) if i.kinds else "all", i.status, i.cursor,
         f"{i.backlog}+" if i.backlog >= BACKLOG_MAX else i.backlog, i.delivered, i.failures,
         i.dead_total, i.retry.in_flight, render.relative(i.last_delivery_at, now),
         render.short(i.last_error or "", 50) or None]
        for i in infos
    ]  # fmt: skip
    out = [render.table(["webhook", "url", "kinds", "delivery", "cursor", "behind", "delivered",
                         "failing", "dead", "window", "last delivery", "last error"],
                        rows)]  # fmt: skip
    for i in infos:
        if i.dead:
            out.append(f"\ndead letters of {i.name} (newest {min(len(i.dead), DEAD_SHOWN)} "
                       f"of {i.dead_total}):")  # fmt: skip
            out.append(render.table(
                ["event", "run", "kind", "given up", "error"],
                [[d.event, d.run_id, d.kind, render.when(d.at), render.short(d.error, 60)]
                 for d in reversed(i.dead[-DEAD_SHOWN:])],
            ))  # fmt: skip
    return "\n".join(out)


@click.group(invoke_without_command=True)
@db_opt(required=False)
@json_option
@click.pass_context
def webhooks(ctx: click.Context, db: str | None, as_json: bool) -> None:
    """Each webhook: where it POSTs, the kinds it takes, its delivery (waiting: caught up),
    the last event it dealt with, how many events it is behind, what it delivered, failed and
    gave up on (its dead letters), its window (POSTs at once: --in-flight).
    'webhooks add' and 'webhooks remove' change them."""
    ctx.obj = db
    if ctx.invoked_subcommand is not None:
        return
    with actions.store_for(group_db(db, ctx)) as store:
        infos = store.webhooks()
        now = store.now()
    click.echo(render.to_json([i.as_json() for i in infos]) if as_json else lines(infos, now))


def read_secret(path: str) -> str:
    """The secret in file ``path`` (``-``: standard input), its trailing newline dropped."""
    if path == "-":
        text = sys.stdin.read(MAX_SECRET + 2)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(f"--secret-file {path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ConfigError(f"--secret-file {path}: not a regular file")
            raw = fh.read(MAX_SECRET + 2)
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise ConfigError(f"--secret-file {path}: not UTF-8 text") from None
    secret = text.rstrip("\r\n")
    if not secret.strip() or len(secret) > MAX_SECRET:
        raise ConfigError(f"--secret-file {path}: the secret must be 1-{MAX_SECRET} characters")
    return secret


@webhooks.command()
@click.argument("name")
@click.argument("url")
@db_opt(required=False)
@option("--kinds", default=None, metavar="LIST",
        help=f"the event kinds to deliver, comma-separated (run.failed, run.*; default: all of "
             f"{', '.join(sorted(KINDS))})")  # fmt: skip
@option("--secret-file", default=None, metavar="F",
        help="the signing secret, read from file F (-: standard input); default: a new random "
             "one, printed once")  # fmt: skip
@option("--after", type=EVENT_ID, default=None, metavar="ID",
        help="deliver the events after this id (default: only events from now on)")  # fmt: skip
@option("--max-failures", type=Number(int, 1, 1000), default=RetryNumbers.max_failures,
        metavar="K", help="deliveries of one event before it is a dead letter")  # fmt: skip
@option("--backoff", type=Number(float, 0.0, 3600.0), default=RetryNumbers.backoff, metavar="S",
        help="the first retry delay; doubles per failure (±25 % jitter)")  # fmt: skip
@option("--backoff-max", type=Number(float, 0.0, 86_400.0), default=RetryNumbers.backoff_max,
        metavar="S", help="the longest retry delay")  # fmt: skip
@option("--timeout", type=Number(float, 0.1, 120.0), default=RetryNumbers.timeout, metavar="S",
        help="how long one POST may take in all (connect, send, the whole answer)")  # fmt: skip
@option("--in-flight", type=Number(int, 1, MAX_IN_FLIGHT), default=RetryNumbers.in_flight,
        metavar="N", help="POSTs at once, across runs (each run's events one at a time): what "
                          "a fault may send again; 1: one at a time")  # fmt: skip
@click.pass_context
def add(
    ctx: click.Context, name: str, url: str, db: str | None, kinds: str | None,
    secret_file: str | None, after: int | None, max_failures: int, backoff: float,
    backoff_max: float, timeout: float, in_flight: int,
) -> None:  # fmt: skip
    """POST every event of the chosen kinds to URL, signed (Leasekeeper-Signature, see the
    protocol's B20), at least once and in order, from every host's workers."""
    secret = read_secret(secret_file) if secret_file is not None else secrets.token_urlsafe(32)
    if backoff > backoff_max:
        raise ConfigError("--backoff must not exceed --backoff-max")
    retry = RetryNumbers(max_failures, backoff, backoff_max, timeout, in_flight)
    chosen = [k for k in kinds.split(",") if k.strip()] if kinds is not None else None
    with actions.store_for(group_db(db, ctx), create=True) as store:
        hook = store.add_webhook(name, url, secret=secret, kinds=chosen, after=after, retry=retry)
    what = ",".join(hook.kinds) if hook.kinds else "every kind"
    click.echo(f"webhook {name}: {what} to {redact_url(url)} (delivery run {hook.run_id})")
    if secret_file is None:
        click.echo(f"secret (shown once; receivers verify with it): {secret}")


@webhooks.command()
@click.argument("name")
@db_opt(required=False)
@click.pass_context
def remove(ctx: click.Context, name: str, db: str | None) -> None:
    """Stop delivering to webhook NAME (its delivery run is cancelled)."""
    with actions.store_for(group_db(db, ctx)) as store:
        if not store.remove_webhook(name):
            raise SupervisorError(f"no webhook {name!r} (see 'supervisor webhooks')")
    click.echo(f"webhook {name} removed")


ALL = [webhooks]
