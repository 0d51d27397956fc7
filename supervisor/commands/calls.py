"""Paid calls: ``supervisor forget RUN NAME`` drops a run's kept answers of one
call, so its step's next attempt pays for a fresh one; ``supervisor resolve RUN NAME`` answers a
call whose outcome is unknown (or has it paid again); ``supervisor spend`` sums the tokens and
cost kept; ``show`` lists a run's calls (``calls_table``)."""

from __future__ import annotations

from typing import Any

import click

from workerproc.store import InvalidPayload
from workerproc.store.calls import PaidCall, Spend
from workerproc.store.codec import check_name

from ..errors import ConfigError
from ..operations import actions, render
from .clickutil import RUN_ID, Name, Number, db_option, json_option, option

SPEND_LIMIT = 100  # the most spent keys shown by default


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.argument("name", metavar="NAME", type=Name("a call's name"))
@db_option
def forget(run_id: int, name: str, db: str) -> None:
    """Drop RUN's kept answers of the call NAME (``ctx.once``): the next attempt pays afresh."""
    with actions.store_for(db) as store:
        gone = store.forget_call(run_id, name)
    click.echo(f"run {run_id}: forgot {gone} paid call(s) named {name!r}")


@click.command()
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.argument("name", metavar="NAME", type=Name("a call's name"))
@db_option
@option("--answer", default=None, metavar="JSON",
        help="the call's answer (JSON), kept as if the call had returned it")  # fmt: skip
@option("--pay-again", is_flag=True, help="let the step's next attempt make the call again")
def resolve(run_id: int, name: str, db: str, answer: str | None, pay_again: bool) -> None:
    """Settle RUN's call NAME (``ctx.once``) whose outcome is unknown: keep --answer as if the
    call had returned it, or --pay-again; a run parked on the call goes on."""
    if (answer is None) == (not pay_again):
        raise click.UsageError("give --answer JSON or --pay-again, one of the two")
    with actions.store_for(db) as store:
        done, answered = actions.resolve_call(store, run_id, name, answer, pay_again,
                                                    "--answer")  # fmt: skip
    click.echo(actions.resolved_line(run_id, name, done, answered))


@click.command()
@db_option
@option("--by", default="task", metavar="task|KEY", show_default=True,
        help="sum per task, or per value of the payload field KEY (tenant, say)")  # fmt: skip
@option("--since", default=None, metavar="DURATION",
        help="only what was kept this long ago or since (3600, 90m, 24h, 7d; 1s-3650d); "
        "default: everything kept")  # fmt: skip
@option("--limit", type=Number(int, 1, 10_000), default=SPEND_LIMIT, metavar="K",
        help="at most K keys, the most spent first")  # fmt: skip
@json_option
def spend(db: str, by: str, since: str | None, limit: int, as_json: bool) -> None:
    """Tokens and cost kept from usage (ctx.usage and paid calls, paid again included), per
    task or per value of a payload field, the most spent first, with their total."""
    by = _field(by)
    seconds = None if since is None else actions.parse_duration(
        since, "--since", bare_seconds=True)  # fmt: skip
    with actions.store_for(db) as store:
        start = 0.0 if seconds is None else store.now() - seconds
        rows = store.spend(by, since=start, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    total = spend_total(rows)
    if as_json:
        doc: dict[str, Any] = {"by": by, "since": None if seconds is None else start,
                               "keys": rows, "total": total, "more": more}  # fmt: skip
        click.echo(render.to_json(doc))
        return
    click.echo(spend_table(by, rows, total))
    if more:
        click.echo(f"(the {limit} most spent keys; the total is theirs: --limit shows more)")


def _field(by: str) -> str:
    """``--by``: ``task``, or a payload field's name as the store takes it (else exit 2)."""
    if by == "task":
        return by
    try:
        check_name(by, "--by")
    except InvalidPayload as exc:
        raise ConfigError(str(exc)) from None
    if any(c in by for c in '"\\'):
        raise ConfigError(f"--by names a payload field: no quotes or backslashes (got {by!r})")
    return by


def spend_total(rows: list[Spend]) -> Spend:
    """The rows summed (cost None when none of them reported one)."""
    costs = [r.cost for r in rows if r.cost is not None]
    return Spend("(total)", sum(r.entries for r in rows), sum(r.calls for r in rows),
                 sum(r.tokens for r in rows), sum(costs) if costs else None)  # fmt: skip


def _cost(value: float | None) -> str | None:
    return None if value is None else f"{value:.6g}"


def spend_table(by: str, rows: list[Spend], total: Spend) -> str:
    if not rows:
        return "no usage kept (ctx.usage and ctx.once's tokens= and cost=)"
    lines = [[r.key if r.key is not None else "(none)", r.entries, r.calls, r.tokens,
              _cost(r.cost)] for r in [*rows, total]]  # fmt: skip
    return render.table([by, "entries", "calls", "tokens", "cost"], lines)


def calls_table(calls: list[PaidCall]) -> str:
    """A run's calls: how often each was made (an intent each), paid again and left with an
    unknown outcome, which attempt paid for the kept answer (none kept: ``-``, ``no``)."""
    rows = [[c.task_id, c.name, c.request_hash[:12], c.started, c.paid_again, c.unknown,
             c.attempt if c.kept else None, c.tokens, c.outcome,
             render.when(c.at) if c.kept else "no"] for c in calls]  # fmt: skip
    headers = ["task", "call", "request", "made", "paid again", "unknown", "paid by", "tokens",
               "outcome", "kept"]  # fmt: skip
    return render.table(headers, rows)


ALL = [forget, resolve, spend]
