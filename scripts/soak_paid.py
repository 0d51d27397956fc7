"""The acceptance soak of paid calls, judged by an outside ledger: 300 runs x one paid
call (fn takes 100-500 ms) under kill+pause chaos (``--lease-ttl 1 --max-attempts 20``, eight
slots, a fault every 0.5 s in all): on SQLite one supervisor ``-n 4 --concurrency 2``, on
PostgreSQL two sharing the database (a fault every 1 s each), ``-n 2 --concurrency 2`` and
``-n 4`` (handlers on the main thread, their calls handed to the paid-call thread).
tests/support/paid_ledger.py runs and judges each soak: every extra payment is a call in flight at a
fault (at most two struck in the keep's own milliseconds), ``paid_again`` >= the extra
payments, every ``once`` returned the first kept answer, every run succeeded.
tests/chaos/test_paid_chaos.py runs the same with 100 runs.

    scripts/soak-paid [--backends sqlite,postgres] [--runs 300] [--keep DIR]

Prints the figures of each soak; exits 1 on any finding. About a minute and a half on 2 cores.
PostgreSQL: ``LEASEKEEPER_TEST_POSTGRES`` (default postgresql://postgres@127.0.0.1:5432/test),
in a schema of its own, dropped after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "support")]  # apps, and the support

import paid_ledger  # noqa: E402 - the tests' soak and judge, shared

ADMIN = os.environ.get("LEASEKEEPER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--keep", metavar="DIR", help="work (and leave the ledgers, logs) in DIR")
    args = ap.parse_args()
    backends = args.backends.split(",")
    soaks = []
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="lk-soak-paid-"))
        if "sqlite" in backends:
            work = Path(tmp) / "sqlite"
            db = str(Path(tmp) / "lk.db")
            soaks.append(paid_ledger.run_soak(work, db, "SQLite", args.runs, supervisors=1))
            print(soaks[-1].line(), flush=True)
        if "postgres" in backends:
            import psycopg  # noqa: PLC0415 - only this part needs it

            schema = f"lk_soak_paid_{secrets.token_hex(4)}"
            url = f"{ADMIN}{'&' if '?' in ADMIN else '?'}schema={schema}"
            try:
                name = "PostgreSQL, two supervisors"
                soaks.append(paid_ledger.run_soak(Path(tmp) / "pg", url, name, args.runs))
                print(soaks[-1].line(), flush=True)
            finally:
                with psycopg.connect(ADMIN, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    for soak in soaks:
        for finding in soak.findings[:20]:
            print(f"{soak.name}: {finding}", file=sys.stderr)
    return 1 if any(s.findings for s in soaks) else 0


if __name__ == "__main__":
    sys.exit(main())
