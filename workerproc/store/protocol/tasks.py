"""Per-task options kept in the database (B11), written once: the ``task_options`` table holds
what each task's ``@app.task(...)`` declares, by task name. Every worker writes its app's
declarations when it starts (only what differs: a pool of identical workers writes once), and
every claim reads the claimed task's row in the claiming statement, so every worker on every
host bounds a task's attempts by the same number, and applies the same backoff and timeout."""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..codec import check_name, task_options
from ..dialect import Dialect, Tx
from ..types import NO_OPTIONS, TaskOptions
from .limits import Limits


class Tasks(Limits):
    dialect: Dialect

    def task_options(self) -> dict[str, TaskOptions]:
        """The declared options of every task that has some, by task name."""
        rows = self.dialect.read(lambda tx: tx.rows("TASK_OPTIONS", {}))
        return {name: task_options(text) for name, text in rows}

    def register_tasks(self, declared: Mapping[str, TaskOptions]) -> int:
        """Make the database hold ``declared`` for these tasks: a task with options gets its
        row, one without loses it (the pool's own options apply again); tasks not named are
        left alone (another app may serve them). Writes only what differs, in one transaction;
        returns how many tasks changed."""
        wanted = {check_name(name): options.declared for name, options in declared.items()}
        held = self.task_options()
        changed = {
            name: options
            for name, options in wanted.items()
            if held.get(name, NO_OPTIONS).declared != options
        }
        if not changed:
            return 0
        self._gatekeeper = None  # a task's limits may have changed: read them again

        def write(tx: Tx) -> int:
            for name, options in sorted(changed.items()):
                if options:
                    text = json.dumps(options, sort_keys=True, separators=(",", ":"))
                    tx.count("SET_TASK_OPTIONS", {"name": name, "options": text, "now": tx.now})
                else:
                    tx.count("DROP_TASK_OPTIONS", {"name": name})
            return len(changed)

        return self.dialect.write(write)
