"""Operator commands on the running supervisor, through its pidfile: stop, reload, scale,
health."""

from __future__ import annotations

import signal

import click

from workerproc.options import DAY

from .. import exitcodes
from ..errors import SupervisorError
from ..operations.render import plural
from . import remote
from .clickutil import Number, pidfile_option

SECONDS = Number(float, 0.1, DAY)  # every wait of these commands: a tenth of a second to a day


@click.command()
@pidfile_option
@click.option("--fast", is_flag=True, help="QUIT: kill workers now (their tasks run again)")
@click.option("--wait", is_flag=True, help="wait until the supervisor has exited")
@click.option(
    "--timeout",
    type=SECONDS,
    default=60.0,
    show_default=True,
    metavar="S",
    help="with --wait: give up after S seconds (exit 1; the supervisor goes on stopping)",
)
def stop(pidfile: str, fast: bool, wait: bool, timeout: float) -> None:
    """Stop the supervisor: TERM (graceful stop) or, with --fast, QUIT."""
    pid = remote.send(pidfile, signal.SIGQUIT if fast else signal.SIGTERM)
    click.echo(f"sent {'QUIT' if fast else 'TERM'} to supervisor {pid}")
    if not wait:
        return
    if not remote.wait_gone(pid, timeout):
        raise SupervisorError(f"supervisor {pid} still running after {timeout:g}s")
    click.echo(f"supervisor {pid} stopped")


@click.command()
@pidfile_option
@click.option(
    "--wait",
    is_flag=True,
    help="wait until every worker runs the new code (exit 11 when the reload failed)",
)
@click.option(
    "--timeout",
    type=SECONDS,
    default=60.0,
    show_default=True,
    metavar="S",
    help="with --wait: give up after S seconds (exit 1; the reload goes on)",
)
def reload(pidfile: str, wait: bool, timeout: float) -> None:
    """HUP: import the app afresh and replace the workers one at a time."""
    if not wait:
        pid = remote.send(pidfile, signal.SIGHUP)
        click.echo(f"sent HUP to supervisor {pid}")
        return
    result = remote.reload(pidfile, timeout)
    on = plural(result.workers, "worker")
    click.echo(f"reload {result.id} done: {on} on generation {result.generation}")


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("count", metavar="N|+K|-K")
@pidfile_option
@click.option(
    "--timeout",
    type=SECONDS,
    default=10.0,
    show_default=True,
    metavar="S",
    help="give up when one step (one worker more or fewer) is not confirmed within S seconds "
    "(exit 1)",
)
def scale(count: str, pidfile: str, timeout: float) -> None:
    """Set the number of workers (TTIN/TTOU, one confirmed step at a time)."""
    result = remote.scale(pidfile, count, timeout)
    click.echo(f"workers: {result.before} -> {result.after}")


@click.command()
@pidfile_option
@click.option(
    "--max-age",
    type=SECONDS,
    default=10.0,
    show_default=True,
    metavar="S",
    help="unhealthy when the main loop has not ticked for this long",
)
@click.option(
    "--max-stall",
    type=SECONDS,
    default=60.0,
    show_default=True,
    metavar="S",
    help="unhealthy when work is ready, workers are free and nothing was claimed for this long",
)
@click.option(
    "--liveness",
    is_flag=True,
    help="fail only when a restart could help (no supervisor, or its loop is silent); report "
    "other problems but exit 0",
)
def health(pidfile: str, max_age: float, max_stall: float, liveness: bool) -> int:
    """Exit 0 when the supervisor is alive, its main loop ticks and its pool makes progress."""
    code, message = remote.health(pidfile, max_age, max_stall)
    click.echo(message, err=code != 0)
    if liveness and code in (exitcodes.STATE_UNWRITABLE, exitcodes.STALLED):
        return exitcodes.OK  # a full disk or a read-only database survives a restart
    return code


ALL = [stop, reload, scale, health]
