"""``supervisor signal``: send a signal to a run (or to every run a file lists), resuming its
wait (``ctx.wait_for``) now or when it next waits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from workerproc.store.codec import MAX_PAYLOAD

from ..errors import ConfigError
from ..operations import actions, render
from .clickutil import RUN_ID, Name, db_option, option

MAX_LISTED = 1_000_000  # runs a --runs-file may list


@click.command()
@click.argument("words", metavar="[RUN] NAME", nargs=-1, required=True)
@db_option
@option("--payload", default="null", metavar="JSON", help="the signal's payload (JSON)")
@option("--runs-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
        metavar="FILE", help="signal every run FILE lists: one id a line (- : stdin)")  # fmt: skip
def signal(words: tuple[str, ...], db: str, payload: str, runs_file: Path | None) -> None:
    """Send signal NAME to RUN: it resumes the run's wait for NAME (ctx.wait_for), now or when
    it next waits for it; a finished or unknown run is an error. With --runs-file, to every run
    the file lists: each one's answer is counted, none is an error."""
    if len(words) != (1 if runs_file is not None else 2):
        shape = "--runs-file FILE NAME" if runs_file is not None else "RUN NAME"
        raise ConfigError(f"signal takes {shape} (got {' '.join(words)})")
    name = _word(Name("signal name"), words[-1], "NAME")
    data = actions.parse_json(payload, "--payload", MAX_PAYLOAD)
    if runs_file is not None:
        ids = _listed(runs_file)
        with actions.store_for(db) as store:
            sent = store.signal_many(ids, name, data)
        kept = sum(sent.values())
        missed = len(sent) - kept
        click.echo(f"signal {name!r} sent to {render.plural(kept, 'run')}"
                   + (f"; {missed} unknown or finished" if missed else ""))  # fmt: skip
        return
    run_id = int(_word(RUN_ID, words[0], "RUN"))
    with actions.store_for(db) as store:
        signal_id = store.signal(run_id, name, data)
        kept_now = [x for x in store.run_signals(run_id, limit=1000) if x.id == signal_id]
    taken = not kept_now or kept_now[0].task_id is not None
    click.echo(f"signal {signal_id} sent to run {run_id}"
               + ("" if taken else f" (kept until it waits for {name!r})"))  # fmt: skip


def _listed(path: Path) -> list[int]:
    """The run ids a --runs-file lists: one per line; blank lines and ``#`` comments skipped."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--runs-file {path}: {exc}") from None
    ids: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        word = line.partition("#")[0].strip()
        if not word:
            continue
        try:
            ids.append(int(RUN_ID.convert(word, None, None)))
        except click.UsageError:
            raise ConfigError(
                f"--runs-file {path}, line {number}: not a run id: {word!r}"
            ) from None
        if len(ids) > MAX_LISTED:
            raise ConfigError(f"--runs-file {path}: more than {MAX_LISTED:,} runs")
    if not ids:
        raise ConfigError(f"--runs-file {path} lists no run")
    return ids


def _word(kind: click.ParamType[Any], word: str, label: str) -> Any:
    """``word`` as ``kind`` takes it; a bad one is one line (exit 2), as a bad option is."""
    try:
        return kind.convert(word, None, None)
    except click.UsageError as exc:
        raise ConfigError(f"signal: {label}{exc.message.removeprefix('value')}") from None


ALL = [signal]
