"""Click plumbing: options that read ``SUPERVISOR_<OPTION>`` and errors as one line."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from workerproc.runner import AppLoadError
from workerproc.store import StoreError

from .. import exitcodes
from ..errors import SupervisorError

F = TypeVar("F", bound=Callable[..., Any])
ENV_PREFIX = "SUPERVISOR_"
NO_ARGS_IS_HELP: type[click.UsageError] = getattr(
    click.exceptions, "NoArgsIsHelpError", type("_Never", (click.UsageError,), {})
)


def envvar_for(decls: Sequence[str]) -> str:
    longest = max((d for d in decls if d.startswith("--")), key=len)
    name = longest[2:].split("/")[0]
    return ENV_PREFIX + name.upper().replace("-", "_")


def option(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    """``click.option`` whose value may also come from ``SUPERVISOR_<OPTION>`` (shown in help)."""
    kwargs.setdefault("envvar", envvar_for(decls))
    kwargs.setdefault("show_envvar", True)
    return click.option(*decls, **kwargs)


db_option = option(
    "--db", required=True, metavar="PATH|URL", help="database file, sqlite:/// or postgresql:// URL"
)
pidfile_option = option(
    "--pidfile", required=True, metavar="FILE", help="the pidfile of the running supervisor"
)
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")


def fail(message: str, code: int) -> None:
    click.echo(f"supervisor: error: {message}", err=True)
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
        except StoreError as exc:
            fail(str(exc), exitcodes.ERROR)
        except OSError as exc:  # a pidfile or log directory we cannot write, say
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), exitcodes.ERROR)
        code = rv if isinstance(rv, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)
