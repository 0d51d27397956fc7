"""The next release of ``versions_v1``'s app: ``translate`` reads its state at version 2, which
has a ``lang``; runs at version 1 are migrated once (B25). Each call of the migration is noted
in ``$LK_TEST_DIR/migrations.log`` (the run's ``n``), so a test counts them from outside."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from workerproc import App, TaskContext

app = App()


@app.migrate("translate", from_version=1)
def add_lang(state: Any) -> Any:
    directory = os.environ.get("LK_TEST_DIR")
    if directory:
        with open(Path(directory) / "migrations.log", "a") as f:
            f.write(f"{state['n']}\n")
    return {**state, "lang": "en"}


@app.task(version=2)
def translate(ctx: TaskContext) -> None:
    state = ctx.state
    if state.get("lang") != "en":  # a version-1 state reached this handler: never
        raise RuntimeError(f"translate read a state without lang: {state!r}")
    ctx.finish({**state, "by": "v2"})
