"""Click plumbing: declared options (with their ``SUPERVISOR_<OPTION>`` variables), the
operator commands' options, arguments that are not UTF-8 (``options.not_utf8``), and errors as
one line."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from workerproc import options
from workerproc.loading import AppLoadError
from workerproc.options import Declared, show_number
from workerproc.store import InvalidOption, InvalidPayload, StoreError, redact
from workerproc.store.codec import check_name

from .. import exitcodes
from ..errors import SupervisorError

F = TypeVar("F", bound=Callable[..., Any])
NO_ARGS_IS_HELP: type[click.UsageError] = getattr(
    click.exceptions, "NoArgsIsHelpError", type("_Never", (click.UsageError,), {})
)


def option(*decls: str, envvar: str | None = None, **kwargs: Any) -> Callable[[F], F]:
    """``click.option`` for the operator commands. Only what names a deployment (the database,
    the pidfile, enqueue's queue) may also come from the environment, through ``envvar`` (shown
    in help); what one call does — its key, payload, state, delay, filters — comes from its own
    command line only: an exported SUPERVISOR_KEY once made every enqueue answer the same run."""
    if envvar is not None:
        kwargs.update(envvar=envvar, show_envvar=True)
    return click.option(*decls, **kwargs)


class DeclaredValue(click.ParamType):  # type: ignore[type-arg]
    """A declared option's value: parsed and range-checked by its declaration (``Opt``), so the
    command line and the environment variable are held to the same rules as the config."""

    def __init__(self, d: Declared) -> None:
        self.d = d
        self.name = d.kind.__name__

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        message: str | None = None
        if isinstance(value, str):
            try:
                value = options.parse(self.d, value)
            except ValueError as exc:
                message = str(exc)
        message = message or options.check(self.d, value)
        if message is None:
            return value
        source = ctx.get_parameter_source(param.name) if ctx and param and param.name else None
        if source is ParameterSource.ENVIRONMENT:
            message += f" (from {self.d.opt.env})"
        raise click.UsageError(message, ctx)  # the message names the flag already


class Number(click.ParamType):  # type: ignore[type-arg]
    """A finite number within [low, high], for the operator commands' options and arguments
    (``supervisor start``'s options are declared in their configs instead)."""

    def __init__(self, kind: type[int] | type[float], low: float, high: float) -> None:
        self.kind, self.low, self.high = kind, low, high
        self.name = kind.__name__

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        label = (
            "/".join(param.opts)
            if isinstance(param, click.Option)
            else (param.human_readable_name if param else "value")
        )
        try:
            number = self.kind(value)
        except (TypeError, ValueError):
            what = "whole number" if self.kind is int else "number"
            raise click.UsageError(f"{label}: {value!r} is not a {what}", ctx) from None
        if not math.isfinite(number) or not self.low <= number <= self.high:
            raise click.UsageError(
                f"{label} must be a number from {show_number(self.low)} to "
                f"{show_number(self.high)} (got {value})",
                ctx,
            )
        return number


RUN_ID = Number(int, 1, 2**63 - 1)


class Name(click.ParamType):  # type: ignore[type-arg]
    """A name the store keeps (a task's, a signal's, a call's), held to the store's rules
    (``check_name``: no control or bidirectional characters, at most 200 characters) before
    anything is opened: a bad one is a bad value (exit 2), as every other."""

    name = "name"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return check_name(value, self.what)
        except InvalidPayload as exc:
            raise click.UsageError(str(exc), ctx) from None


class DeclaredOption(click.Option):
    """A declared option in ``--help``: its default reads as the README shows it (``default:
    1``, ``default: ttl / 3``), never in click's parentheses for a default given as text."""

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        if isinstance(self.show_default, str) and "default" in extra:
            extra["default"] = self.show_default
        return extra


def declared_option(d: Declared) -> Callable[[F], F]:
    """The click option of one declaration: flag, env var, default, help and checks from it."""
    o = d.opt
    decls = [o.short, o.flag] if o.short else [o.flag]
    kwargs: dict[str, Any] = {
        "envvar": o.env,
        "show_envvar": True,
        "help": o.help,
        "show_default": options.shown_default(d),
    }
    if d.kind is bool and "/" not in o.flag:
        kwargs.update(is_flag=True, default=d.default)
    elif d.kind is bool:
        kwargs["default"] = d.default
    else:
        kwargs.update(type=DeclaredValue(d), metavar=o.metavar, required=d.required)
        if not d.required:
            kwargs["default"] = d.default
    if o.multiple:  # each occurrence is a list itself: ``--allowed-host a,b --allowed-host c``
        kwargs.update(multiple=True, callback=_joined)
    if d.required:
        kwargs["show_default"] = False
    return click.option(*decls, o.name, cls=DeclaredOption, **kwargs)


def _joined(ctx: click.Context, param: click.Parameter, value: Any) -> tuple[str, ...]:
    return tuple(item for part in value or () for item in part)


def declared_options(declarations: Sequence[Declared]) -> Callable[[F], F]:
    """Every declaration as a click option, in the given order."""

    def decorate(fn: F) -> F:
        for d in reversed(declarations):
            fn = declared_option(d)(fn)
        return fn

    return decorate


def db_opt(required: bool = True) -> Callable[[F], F]:
    """``--db``, declared here once (``required=False``: a command group's, which its
    subcommands may take instead)."""
    return option(
        "--db",
        envvar="SUPERVISOR_DB",
        required=required,
        metavar="PATH|URL",
        help="database file, sqlite:/// or postgresql:// URL",
    )


def group_db(db: str | None, ctx: click.Context) -> str:
    """A group's subcommand's database: its own ``--db``, else the group's (kept in
    ``ctx.obj``), else a usage error."""
    given = db or (ctx.obj if isinstance(ctx.obj, str) else None)
    if not given:
        raise click.UsageError("Missing option '--db' (or SUPERVISOR_DB)", ctx)
    return given


db_option = db_opt()
pidfile_option = option(
    "--pidfile",
    envvar="SUPERVISOR_PIDFILE",
    required=True,
    metavar="FILE",
    help="the pidfile of the running supervisor",
)
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")


def fail(message: str, code: int) -> None:
    # A driver's error may quote the URL it was given: never a password on the terminal. It may
    # also span lines (libpq adds a hint on a line of its own): one line, always.
    line = " ".join(redact(message).split())
    click.echo(f"supervisor: error: {line}", err=True)
    sys.exit(code)


class SupervisorGroup(click.Group):
    """Turns every error users can cause into one line on stderr and an exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        problem = options.not_utf8(sys.argv[1:] if args is None else args)
        if problem is not None:
            fail(f"{problem}: leasekeeper takes text as UTF-8", exitcodes.USAGE)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NO_ARGS_IS_HELP as exc:
            exc.show()  # ``supervisor`` alone: the help text, not an error line
            sys.exit(exitcodes.USAGE)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else "supervisor"
            fail(f"{exc.format_message()} (see '{where} --help')", exitcodes.USAGE)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            fail("interrupted", 130)
        except SupervisorError as exc:
            fail(str(exc), exc.exit_code)
        except AppLoadError as exc:
            fail(str(exc), exitcodes.APP_LOAD)
        except InvalidOption as exc:  # a --db URL or store option that names nothing valid
            fail(str(exc), exitcodes.USAGE)
        except StoreError as exc:
            fail(str(exc), exitcodes.ERROR)
        except OSError as exc:  # a pidfile or log directory we cannot write, say
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), exitcodes.ERROR)
        code = rv if isinstance(rv, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)
