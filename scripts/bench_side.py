"""One measurement of ``scripts/bench --parts``, run with the code of the tree on PYTHONPATH.

``scripts/bench --parts ... --before REV`` measures this checkout and an earlier commit in the
same run. Each measurement that runs our code (a drain, a limit's claim, a webhook's delivery,
PostgreSQL's server CPU) runs here, in a process whose PYTHONPATH puts that tree's packages
first and this directory's benchmark modules after them: each tree makes its own databases with
its own schema, and its pools are started by its own ``supervisor``. The measurement's figures
are printed as one JSON object on the last line of stdout.

    PYTHONPATH=TREE:scripts python scripts/bench_side.py KIND JSON-ARGUMENTS
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def noop(a: dict[str, Any]) -> dict[str, float]:
    """``m`` no-op runs drained by ``supervisor start SHAPE --drain`` on SQLite (FULL): runs/s,
    and the CPU (user + system) the pool spent per run, its supervisor and workers together
    (this process's children, waited for: the workers are counted as their supervisor waits
    for them). CPU per run is the steadier figure on a loaded machine."""
    from bench_procs import drain  # noqa: PLC0415 - with the tree's packages on the path
    from bench_store import bulk_runs, new_db  # noqa: PLC0415

    db = new_db(a["dir"], f"noop-{time.monotonic_ns()}")
    bulk_runs(db, a["m"], time.time() - 1)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rate = a["m"] / drain(db, a["m"], f"sqlite:///{db}", a["shape"])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"rate": rate, "cpu_us": cpu / a["m"] * 1e6}


def io(a: dict[str, Any]) -> dict[str, float]:
    """``runs`` I/O steps (a sleep of ``seconds``) at ``SHAPE``: seconds from start to exit."""
    from bench_procs import drain  # noqa: PLC0415
    from bench_store import new_db  # noqa: PLC0415

    from workerproc.store import open_store  # noqa: PLC0415

    db = new_db(a["dir"], f"io-{time.monotonic_ns()}")
    with open_store(db) as store:
        store.start_runs([{"task": "io_sync", "payload": a["seconds"]}] * a["runs"])
    return {"seconds": drain(db, a["runs"], f"sqlite:///{db}", a["shape"])}


def _database(a: dict[str, Any], stack: Any) -> str:
    """A fresh SQLite file, or a fresh database on the server (dropped at the end)."""
    if a["backend"] == "sqlite":
        return os.path.join(a["dir"], f"db-{time.monotonic_ns()}.db")
    import bench_pg  # noqa: PLC0415 - the postgres extra

    return str(stack.enter_context(bench_pg.bench_database(a["server"])))


def limits(a: dict[str, Any]) -> dict[str, float]:
    """No-op runs/s of ``-n W --drain`` with a limit that never binds, or without limits."""
    from contextlib import ExitStack  # noqa: PLC0415

    import bench_limits  # noqa: PLC0415

    with ExitStack() as stack:
        url = _database(a, stack)
        return {"rate": bench_limits.drain(url, a["m"], a["workers"], a["limited"])}


def claim(a: dict[str, Any]) -> dict[str, float]:
    """A batched claim's p50 with ``keys`` keys of a binding per-key cap (concurrency 1 a key)
    over ``waiting`` runs, and the same claim without limits: the cap's cost."""
    from contextlib import ExitStack  # noqa: PLC0415

    import bench_limits  # noqa: PLC0415

    with ExitStack() as stack:
        plain = bench_limits.backlog(_database(a, stack), a["keys"], a["waiting"], False)
        gated = bench_limits.backlog(_database(a, stack), a["keys"], a["waiting"], True)
        try:
            out: dict[str, list[float]] = {"plain": [], "gated": []}
            for k in range(4):  # interleaved quarters: a slow moment hits both alike
                for name, s in (("plain", plain), ("gated", gated))[:: 1 - 2 * (k % 2)]:
                    out[name] += bench_limits.claim_times(s, max(1, a["samples"] // 4), 16)
        finally:
            plain.close()
            gated.close()
    return {f"{n}_p50_ms": bench_limits.pct(v, 0.5) * 1e3 for n, v in out.items()}


def pg(a: dict[str, Any]) -> dict[str, float]:
    """PostgreSQL: runs/s of ``-n W --concurrency C`` and the server's CPU per run."""
    import bench_pg  # noqa: PLC0415
    import bench_pg_cost  # noqa: PLC0415

    with bench_pg.bench_database(a["server"]) as database:
        r = bench_pg_cost.measure(database, a["m"], a["workers"], a["concurrency"])
    return {"rate": r["drain_rate"], "server_us": r["drain_us"], "xacts": r["xacts"]}


def webhooks(a: dict[str, Any]) -> dict[str, float]:
    """Webhook delivery: a backlog's deliveries/s and a webhook's catch-up over done runs."""
    from contextlib import ExitStack  # noqa: PLC0415

    import bench_webhooks  # noqa: PLC0415

    with ExitStack() as stack:
        row = bench_webhooks.one(_database(a, stack), a["runs"], a["trickle"])
        row["catch_up_per_s"] = bench_webhooks.catch_up(_database(a, stack), a["runs"])
    return row


KINDS: dict[str, Callable[[dict[str, Any]], dict[str, float]]] = {
    "noop": noop, "io": io, "limits": limits, "claim": claim, "pg": pg, "webhooks": webhooks,
}  # fmt: skip


def main(argv: list[str]) -> int:
    kind, arguments = argv[0], json.loads(argv[1])
    with tempfile.TemporaryDirectory(prefix="lk-side-", dir=arguments.get("dir")) as tmp:
        arguments["dir"] = tmp
        figures = KINDS[kind](arguments)
    sys.stdout.flush()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
