"""A consumer of the outbox in a process of its own (tests/chaos/test_events_chaos.py): follows the
events from its named cursor, appends each one as a JSON line to a file (one ``os.write``,
O_APPEND) and only then acknowledges it. Killed at any moment and started again, it goes on
from its cursor: at least once, never a gap.

``python -m apps.event_consumer DB OUT NAME``
"""

from __future__ import annotations

import json
import os
import sys

from workerproc.store import open_store


def main(db: str, out: str, name: str) -> None:
    with open_store(db) as store:
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        for event in store.follow(consumer=name, limit=50, poll=0.5):
            line = {"id": event.id, "kind": event.kind, "run": event.run_id, "pid": os.getpid()}
            os.write(fd, (json.dumps(line) + "\n").encode())
            store.ack_events(name, event.id)


if __name__ == "__main__":
    main(*sys.argv[1:4])
