"""``python -m workerproc --db PATH --app MOD:ATTR``: one worker, without the supervisor.

Its options are ``WorkerConfig``'s declarations (the same flags, ranges and environment
variables as ``supervisor start``); bad values print one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from . import exitcodes, logs, options
from .config import WorkerConfig
from .runner import AppLoadError, load_app, run_worker

USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + line
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m workerproc", description=__doc__.splitlines()[0])
    for d in options.declared(WorkerConfig):
        o = d.opt
        if not o.on_worker:
            continue
        env = os.environ.get(o.env)
        default = d.default if env is None else env
        help_text = f"{o.help} (default {options.shown_default(d)}; env {o.env})"
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        if d.kind is bool:
            p.add_argument(o.long, action="store_true", default=default, help=help_text)
        else:
            p.add_argument(o.long, metavar=o.metavar, default=default, help=help_text)
    p.add_argument("--exit-with-parent", action="store_true", help="die when the parent dies")
    return p


def config_from(args: argparse.Namespace) -> WorkerConfig:
    """Parse and check every declared option; ValueError names the first bad one."""
    values: dict[str, Any] = {}
    for d in options.declared(WorkerConfig):
        raw = getattr(args, d.opt.name, None) if d.opt.on_worker else d.default
        if raw is None and d.required:
            raise ValueError(f"{d.opt.label} is required (or set {d.opt.env})")
        values[d.field] = options.parse(d, raw) if isinstance(raw, str) else raw
    return WorkerConfig(**values).validate()


def main(argv: list[str] | None = None) -> int:
    problem = options.not_utf8(sys.argv[1:] if argv is None else argv)
    if problem is not None:  # a path or queue name no database, log or terminal takes
        print(f"python -m workerproc: error: {problem}: leasekeeper takes text as UTF-8",
              file=sys.stderr)  # fmt: skip
        return USAGE
    args = parser().parse_args(argv)
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"python -m workerproc: error: {exc}", file=sys.stderr)
        return USAGE
    logs.configure(config.log_level)  # every record, the handlers' own too, tagged with its task
    try:
        app = load_app(config.app)
    except AppLoadError as exc:
        print(f"python -m workerproc: error: {exc}", file=sys.stderr)
        return exitcodes.BOOT_FAILURE
    parent = os.getppid() if args.exit_with_parent else None
    return run_worker(app, config, parent_pid=parent)


if __name__ == "__main__":
    sys.exit(main())
