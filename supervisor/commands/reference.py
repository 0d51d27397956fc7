"""The reference tables of the README and the docs site, made from the declarations they
describe: options from ``workerproc.options`` declarations, exit codes from ``DESCRIPTIONS``.
``scripts/readme-tables`` writes them into every page between ``<!-- table:NAME -->`` and
``<!-- /table -->``; a test fails when a page differs, so the tables cannot drift from the code."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from workerproc import exitcodes as worker_exitcodes
from workerproc import options
from workerproc.config import WorkerConfig

from .. import exitcodes
from ..config import start_options
from ..web.config import WebConfig


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _flag(d: options.Declared) -> str:
    o = d.opt
    if d.kind is bool and "/" in o.flag:
        on, off = o.flag.split("/")
        return f"`{on} / {off}`"
    shown = f"{o.short}`, `{o.long}" if o.short else o.long
    metavar = f" {o.metavar}" if o.metavar else ""
    return f"`{shown}{metavar}`".replace("|", "\\|")


def _meaning(d: options.Declared) -> str:
    text = d.opt.meaning or d.opt.help
    bounds = d.opt.bounds() if d.kind in (int, float) else ""
    return f"{text} ({bounds})" if bounds else text


def options_table(declarations: Iterable[options.Declared]) -> str:
    lines = [_row(["option", "env var", "default", "meaning"]), _row(["---"] * 4)]
    for d in declarations:
        lines.append(_row([_flag(d), f"`{d.opt.env}`", options.shown_default(d), _meaning(d)]))
    return "\n".join(lines)


def codes_table(descriptions: dict[int, str]) -> str:
    lines = [_row(["code", "meaning"]), _row(["---"] * 2)]
    lines += [_row([str(code), text]) for code, text in sorted(descriptions.items())]
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {
    "start-options": lambda: options_table(start_options()),
    "worker-options": lambda: options_table(
        d for d in options.declared(WorkerConfig) if d.opt.on_worker
    ),
    "web-options": lambda: options_table(options.declared(WebConfig)),
    "exit-codes": lambda: codes_table(exitcodes.DESCRIPTIONS),
    "worker-exit-codes": lambda: codes_table(worker_exitcodes.MEANINGS),
}

_BLOCK = re.compile(
    r"<!-- table:(?P<name>[\w-]+) -->\n(?:(?!<!-- /table -->).)*<!-- /table -->", re.S
)


def render(readme: str) -> str:
    """``readme`` (any page) with every generated table replaced by what the code declares now."""

    def fill(match: re.Match[str]) -> str:
        make = TABLES.get(match["name"])
        if make is None:
            raise KeyError(f"README names an unknown table {match['name']!r}")
        return f"<!-- table:{match['name']} -->\n{make()}\n<!-- /table -->"

    return _BLOCK.sub(fill, readme)


def names_in(readme: str) -> set[str]:
    return {m["name"] for m in _BLOCK.finditer(readme)}
