"""A walk through the lease protocol on ./demo.db: claim, renew, takeover, a zombie refused."""

from __future__ import annotations

import os
import sys

from workerproc.store import open_store


def main() -> int:
    path = os.path.abspath("demo.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    now = [1_000.0]
    store = open_store(path, clock=lambda: now[0])  # a clock we can move: no sleeping for a ttl
    say = print
    say(f"store: {store.url}")
    run_id = store.start_run("prepare", {"doc": "cv.pdf"}, state={"tokens": 0})
    say(f"started run {run_id}")
    a = store.claim("worker-A", ttl=60)
    assert a is not None
    say(f"worker-A claims task {a.task_id} of run {a.run_id}, attempt {a.attempt}")
    now[0] += 20
    say(f"renew at +20 s -> expires {store.renew_until(a, 60)} (max(old, now + ttl))")
    say(
        f"worker-A advances run {a.run_id}: {store.advance(a, a.revision, {'tokens': 120}, 'call')}"
    )
    b = store.claim("worker-A", ttl=60)
    assert b is not None
    say(f"worker-A claims '{b.task}' of run {b.run_id}, attempt {b.attempt}; then it freezes...")
    now[0] += 61
    say(f"61 s later the lease expired; worker-A's renewal -> {store.renew(b, 60)}")
    c = store.claim("worker-B", ttl=60)
    assert c is not None
    say(f"worker-B takes over task {c.task_id} with attempt {c.attempt}")
    zombie = store.compare_and_set(b, b.revision, {"tokens": 999})
    say(f"worker-A wakes up and writes (attempt {b.attempt}) -> {zombie}")
    say(f"worker-B finishes -> {store.finish(c, c.revision, {'tokens': 420}, result='ok')}")
    run = store.get_run(c.run_id)
    assert run is not None and zombie == "lease_lost" and run.state == {"tokens": 420}
    say(f"run {run.id}: {run.status}, state {run.state}: only the live owner's write landed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
