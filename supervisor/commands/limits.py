"""``supervisor limits``: the flow-control limits every host obeys, their numbers,
their use now and their busiest keys; ``supervisor limits set`` changes their numbers at run time
for every worker on every host, until a release declares other numbers."""

from __future__ import annotations

from typing import Any

import click

from workerproc.store.limits import TOO_LARGE, LimitInfo, per_second, unfit

from ..errors import ConfigError
from ..operations import actions, render
from .clickutil import Number, db_opt, group_db, json_option, option

LIFTED = ("0", "none")  # what lifts a number


def _per_minute(value: float | None) -> str | None:
    return None if value is None else f"{value * 60:g}/m"


def as_dict(info: LimitInfo) -> dict[str, Any]:
    """One limit for scripts, the dashboard and the metrics (rates per second)."""
    s = info.spec
    return {
        "name": info.name, "per": s.per, "rate": s.rate, "burst": s.burst,
        "concurrency": s.concurrency, "tokens": s.tokens, "token_burst": s.token_burst,
        "declared": info.declared, "declared_by": info.declared_by, "set": info.overrides,
        "in_use": info.in_use, "waiting": info.waiting, "used_tokens": info.used_tokens,
        "level": info.level, "tokens_left": info.tokens_left,
        "keys": [k._asdict() for k in info.keys],
    }  # fmt: skip


def lines(infos: list[LimitInfo]) -> str:
    """The limits as people read them: one row each, then the busiest keys of keyed ones."""
    if not infos:
        return "no limit is declared (an app declares them with app.limit)"
    rows = [
        [i.name, i.spec.per, _per_minute(i.spec.rate), i.spec.burst, i.spec.concurrency,
         _per_minute(i.spec.tokens), i.in_use, i.waiting, i.level, i.tokens_left, i.used_tokens,
         "set" if i.overrides else i.declared_by]
        for i in infos
    ]  # fmt: skip
    out = [render.table(["limit", "per", "rate", "burst", "concurrency", "tokens", "in use",
                         "waiting", "level", "tokens left", "tokens used", "numbers by"],
                        rows)]  # fmt: skip
    for i in infos:
        if i.spec.per is not None and i.keys:
            out.append(f"\nbusiest keys of {i.name} (payload[{i.spec.per!r}]):")
            out.append(render.table(
                ["key", "in use", "waiting", "paused until", "level", "tokens left"],
                [[k.key or "(none)", k.live, k.waiting, render.when(k.paused_until), k.level,
                  k.tokens_left] for k in i.keys],
            ))  # fmt: skip
    return "\n".join(out)


@click.group(invoke_without_command=True)
@db_opt(required=False)
@option("--keys", "keys", type=Number(int, 0, 100), default=5, metavar="K",
        help="the busiest keys shown of each limit with per")  # fmt: skip
@json_option
@click.pass_context
def limits(ctx: click.Context, db: str | None, keys: int, as_json: bool) -> None:
    """Each limit with its numbers, its use now (slots held, bucket levels, tokens), the runs
    waiting behind it and its busiest keys. 'limits set' changes its numbers."""
    ctx.obj = db
    if ctx.invoked_subcommand is not None:
        return
    db = group_db(db, ctx)
    with actions.store_for(db) as store:
        infos = store.limits(keys=keys)
    click.echo(render.to_json([as_dict(i) for i in infos]) if as_json else lines(infos))


def _rate(value: str | None, what: str) -> float | None:
    if value is None:
        return None
    if value.strip().lower() in LIFTED:
        return 0.0
    try:
        return per_second(value, what)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _amount(value: str | None, what: str, kind: type[int] | type[float], high: float) -> Any:
    if value is None:
        return None
    if value.strip().lower() in LIFTED:
        return 0
    try:
        number = kind(value)
    except ValueError:
        number = -1
    if not 1 <= number <= high:
        raise ConfigError(f"{what} must be from 1 to {high:g}, or 0 or none to lift it "
                          f"(got {value!r})")  # fmt: skip
    return number


@limits.command(name="set")
@click.argument("name")
@db_opt(required=False)
@option("--rate", default=None, metavar="R", help="starts per time: 500/m, 10/s (0/none: lift)")
@option("--burst", default=None, metavar="B", help="starts at once after a quiet spell")
@option("--concurrency", default=None, metavar="C", help="handlers running at once (0/none: lift)")
@option("--tokens", default=None, metavar="T", help="tokens per time: 200000/m (0/none: lift)")
@option("--token-burst", default=None, metavar="TB", help="the token bucket's size")
@click.pass_context
def set_(
    ctx: click.Context, name: str, db: str | None, rate: str | None, burst: str | None,
    concurrency: str | None, tokens: str | None, token_burst: str | None,
) -> None:  # fmt: skip
    """Change limit NAME's numbers now, for every worker on every host (only those given; 0 or
    none lifts one). They hold until a release of the app declares other numbers."""
    numbers = {
        "rate": _rate(rate, "--rate"), "tokens": _rate(tokens, "--tokens"),
        "burst": _amount(burst, "--burst", float, 1e9),
        "token_burst": _amount(token_burst, "--token-burst", float, 1e9),
        "concurrency": _amount(concurrency, "--concurrency", int, 1_000_000),
    }  # fmt: skip
    given = {k: v for k, v in numbers.items() if v is not None}
    if not given:
        raise ConfigError("give at least one of --rate, --burst, --concurrency, --tokens, "
                          "--token-burst")  # fmt: skip
    with actions.store_for(group_db(db, ctx)) as store:
        spec = store.set_limit(name, **given)
        declared = store.task_options()
    shown = {k: _per_minute(v) if k in ("rate", "tokens") else v
             for k, v in spec.numbers.items()}  # fmt: skip
    click.echo(f"limit {name}: {', '.join(f'{k} {v}' for k, v in shown.items())} "
               "(every host, until a release declares other numbers)")  # fmt: skip
    reserving = {t: (o.limits, o.tokens) for t, o in declared.items() if o.limits}
    for line in unfit(reserving, {name: spec}):  # B12: such runs fail at claim from now on
        click.echo(f"warning: {line}; its runs fail at claim ({TOO_LARGE})", err=True)


ALL = [limits]
