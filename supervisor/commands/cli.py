"""The ``supervisor`` command: ``start`` runs the pool; the rest are operator commands.

Parse -> ``StartConfig`` -> ``validate()`` -> run. Every option of ``start`` and ``web`` can
also come from its variable (``SUPERVISOR_<OPTION>``; ``--help`` shows each); the operator
commands take only ``--db``, ``--pidfile`` and enqueue's ``--queue`` from the environment: what
one call does is on its command line.
"""

from __future__ import annotations

import gc
import importlib
from gettext import gettext as _

import click

from workerproc import __version__

from .clickutil import SupervisorGroup

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# Each command's module, imported only when that command runs (or when ``--help`` lists them
# all): ``supervisor show RUN`` never loads the pool, the dashboard's web stack or the metrics
# exposition. Each module's ``ALL`` lists its commands; tests/cli/test_cli_lazy.py checks that
# this table names every one of them, and nothing else.
COMMANDS = {
    "start": "start_command",
    **dict.fromkeys(["enqueue", "status", "runs", "show", "wait", "check", "prune", "migrate"],
                    "database"),
    **dict.fromkeys(["retry", "cancel", "fork"], "runops"),
    **dict.fromkeys(["forget", "resolve", "spend"], "calls"),
    "schedules": "schedules",
    "limits": "limits",
    "signal": "waits",
    **dict.fromkeys(["stop", "reload", "scale", "health"], "control"),
    "events": "events",
    "stream": "streams",
    "webhooks": "webhooks",
    "web": "web",
}  # fmt: skip

# Each command's one-line help as ``supervisor --help`` lists it (its docstring's first sentence,
# shortened to the width as click shortens it): the listing imports no command's module.
# tests/cli/test_cli_lazy.py checks that each line is its command's own.
SUMMARIES = {
    "cancel": (
        "Cancel a run that has not finished; a handler running it is stopped within a heartbeat."
    ),
    "check": (
        "Check the database: the engine's own storage check, then the lease invariants; the "
        "limits' lines are recounted, and a line whose runs could wait for ever is reopened."
    ),
    "enqueue": "Start a run whose first task is TASK; print its id.",
    "events": (
        "Run transitions in commit order: enqueued, claimed, taken over, committed, released, "
        "handed back, refused writes, succeeded, failed, cancelled (of the system's own runs too "
        "with --all or their --run)."
    ),
    "forget": (
        "Drop RUN's kept answers of the call NAME (``ctx.once``): the next attempt pays afresh."
    ),
    "fork": (
        "Start a new run from step STEP of run RUN and print its id: it runs STEP's task (its "
        "payload) and what follows, from the state RUN had when it entered STEP (or --state)."
    ),
    "health": (
        "Exit 0 when the supervisor is alive, its main loop ticks and its pool makes progress."
    ),
    "limits": (
        "Each limit with its numbers, its use now (slots held, bucket levels, tokens), the runs "
        "waiting behind it and its busiest keys."
    ),
    "migrate": (
        "Create the database's schema, or bring it to this version (start and enqueue do it "
        "themselves; the reading commands never do)."
    ),
    "prune": (
        "Delete finished runs (and their tasks) that finished longer than DURATION ago, and "
        "events as old that every named consumer has acknowledged."
    ),
    "reload": "HUP: import the app afresh and replace the workers one at a time.",
    "resolve": (
        "Settle RUN's call NAME (``ctx.once``) whose outcome is unknown: keep --answer as if the "
        "call had returned it, or --pay-again; a run parked on the call goes on."
    ),
    "retry": (
        "Queue a failed or cancelled run again (its attempts start over); without RUN, every "
        "failed (or --status cancelled) run the filter matches."
    ),
    "runs": (
        "List runs, newest first (the system's own runs, numbered apart, with --all or their "
        "queue named)."
    ),
    "scale": "Set the number of workers (TTIN/TTOU, one confirmed step at a time).",
    "schedules": (
        "The schedules every app declared: cron, time zone, task, next tick, last tick, last run "
        "and its status, and how many runs each started."
    ),
    "show": (
        "One run: state, result, failure and its tasks (by step, as fork --from counts them): how "
        "many times each ran (executions) and "
        "was claimed (claims: also a claim that found the attempt budget spent), and its errors; "
        "its paid calls (ctx.once): how often each was made, paid again, left unknown and reused;"
        " and, for a batch step, which batch call (its id and size) each attempt went in."
    ),
    "signal": (
        "Send signal NAME to RUN: it resumes the run's wait for NAME (ctx.wait_for), now or when "
        "it next waits for it; a finished or unknown run is an error."
    ),
    "spend": (
        "Tokens and cost kept from usage (ctx.usage and paid calls, paid again included), per "
        "task or per value of a payload field, the most spent first, with their total."
    ),
    "start": "Fork N workers and keep them alive until TERM/INT (graceful) or QUIT (fast).",
    "status": (
        "The worker processes every host lists in the database, this host's supervisor and its "
        "workers (pid, RSS, task, lease expiry), queue counts and runs by status."
    ),
    "stop": "Stop the supervisor: TERM (graceful stop) or, with --fast, QUIT.",
    "stream": "The chunks run RUN's steps emitted (ctx.emit), in order.",
    "wait": (
        "Wait until RUN ends; the exit code says how (0 succeeded, 12 failed, 13 cancelled, 14 "
        "still running after --timeout, 15 no such run)."
    ),
    "web": "Serve the dashboard: runs, their attempts, live leases, workers, the chaos report.",
    "webhooks": (
        "Each webhook: where it POSTs, the kinds it takes, its delivery (waiting: caught up), the"
        " last event it dealt with, how many events it is behind, what it delivered, failed and "
        "gave up on (its dead letters), its window (POSTs at once: --in-flight)."
    ),
}


class LazyGroup(SupervisorGroup):
    """The ``supervisor`` group, each command imported from its module at its first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module = importlib.import_module(f"{__package__}.{where}")
        found: dict[str, click.Command] = {c.name or "": c for c in module.ALL}
        return found[cmd_name]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own listing (``Group.format_commands``), each line from ``SUMMARIES``."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(n, click.Command(n, help=SUMMARIES[n]).get_short_help_str(limit)) for n in names]
        with formatter.section(_("Commands")):
            formatter.write_dl(rows)


@click.group(name="supervisor", cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", "-V", prog_name="supervisor",
                      message="%(prog)s (leasekeeper) %(version)s")  # fmt: skip
def cli() -> None:
    """leasekeeper's supervisor: run a pool of workers and operate its database."""


def main() -> None:
    try:
        cli.main(prog_name="supervisor")
    finally:
        # The process ends now. Without this the interpreter's teardown walks every object
        # the imports made, in its final collections (20-40 ms on the 2-core VM: a sixth of a
        # one-run command's time); frozen, they are freed as their modules are cleared. The
        # handlers at exit (logging's flush) still run.
        gc.freeze()
