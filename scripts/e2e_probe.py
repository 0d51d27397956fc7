"""Read and write the e2e container's database through the store API (run inside it as the
service's user by scripts/e2e-systemd; prints JSON).

    e2e_probe.py DB enqueue TASK COUNT PAYLOAD_JSON   -> [run ids]
    e2e_probe.py DB leases                            -> [{task_id, run_id, attempt, owner}]
    e2e_probe.py DB runs ID...                        -> {id: {status, result, tasks: [...]}}
"""

import json
import sys

from workerproc.store import open_store


def main(argv: list[str]) -> object:
    store = open_store(argv[0])
    try:
        what = argv[1]
        if what == "enqueue":
            task, count, payload = argv[2], int(argv[3]), json.loads(argv[4])
            return [store.start_run(task, payload, state={}) for _ in range(count)]
        if what == "leases":
            stats = store.stats()
            return [
                {"task_id": x.task_id, "run_id": x.run_id, "attempt": x.attempt, "owner": x.owner}
                for x in stats.leases
                if x.expires_at > stats.now
            ]
        if what == "runs":
            out = {}
            for run_id in (int(a) for a in argv[2:]):
                run = store.get_run(run_id)
                tasks = store.get_tasks(run_id)
                out[run_id] = {
                    "status": run.status if run else None,
                    "result": run.result if run else None,
                    "tasks": [
                        {"id": t.id, "attempts": t.attempts, "done": t.done_at is not None}
                        for t in tasks
                    ],
                }
            return out
        raise SystemExit(f"unknown command {what!r}")
    finally:
        store.close()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
