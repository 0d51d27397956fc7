"""A store client whose process clock the test moves (run under libfaketime: tests/support/
faketime.py): it reads one JSON command a line on stdin and answers one JSON line on stdout.

    {"op": "time"}                                   -> {"wall": time.time(), "store": store.now()}
    {"op": "claim", "as": NAME, "owner": O, "ttl": T} -> {"lease": {...} | null}  (kept as NAME)
    {"op": "renew", "as": NAME, "ttl": T}            -> {"expires_at": float | null}
    {"op": "finish", "as": NAME}                     -> {"result": "ok" | "conflict" | "lease_lost"}

    python clock_agent.py URL
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from workerproc.store import Commit, Lease, open_store


def main() -> int:
    store = open_store(sys.argv[1])
    leases: dict[str, Lease] = {}
    for line in sys.stdin:
        cmd: dict[str, Any] = json.loads(line)
        op = cmd["op"]
        answer: dict[str, Any]
        if op == "time":
            answer = {"wall": time.time(), "store": store.now()}
        elif op == "claim":
            lease = store.claim(cmd["owner"], cmd["ttl"])
            if lease is not None:
                leases[cmd["as"]] = lease
            answer = {"lease": None if lease is None else {
                "task_id": lease.task_id, "attempt": lease.attempt, "owner": lease.owner,
                "expires_at": lease.expires_at, "claimed_at": lease.claimed_at}}  # fmt: skip
        elif op == "renew":
            answer = {"expires_at": store.renew_many([leases[cmd["as"]]], cmd["ttl"])[0]}
        elif op == "finish":
            lease = leases[cmd["as"]]
            step = Commit(
                lease, "finish", expected_revision=lease.revision, new_state={"by": "agent"}
            )
            answer = {"result": store.commit_many((step,)).results[0].value}
        else:
            answer = {"error": f"no op {op!r}"}
        print(json.dumps(answer), flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
