"""Finished runs, counted as they end, so that ``stats()`` reads no finished run and
costs the same beside ten million of them as beside a thousand.

Every statement that ends a run (a finish, a failure, an exhausted claim, a cancel, the ack of a
run's last task), gives one back (a retry) or deletes one (prune) is followed, in the same
transaction, by ``counted``: one ``COUNT_ENDED`` per queue and status it changed, held back
to the COMMIT with the transaction's other deferred writes (``Tx.deferred``): PostgreSQL sends
them in the COMMIT's round trip, and a total's row is locked from there to the COMMIT only.
A backend keeps several rows (shards) per queue and status and a writer picks one at random, so two
writers of the same queue seldom wait on one row; ``RUN_TOTALS`` sums them.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

from ..dialect import Tx

SHARDS = 16


def counted(tx: Tx, changes: Iterable[tuple[str, str, int]]) -> None:
    """Add each ``(queue, status, n)`` to the totals (``n`` may be negative)."""
    summed: Counter[tuple[str, str]] = Counter()
    for queue, status, n in changes:
        summed[(queue, status)] += n
    shard = random.randrange(SHARDS)
    each = [{"queue": queue, "status": status, "n": n, "shard": shard}
            for (queue, status), n in sorted(summed.items()) if n]  # fmt: skip
    if each:  # held back to the COMMIT (a dialect may send it in the COMMIT's round trip)
        tx.deferred.append(("COUNT_ENDED", each))


def ended(tx: Tx, queue: str, status: str) -> None:
    """One run of ``queue`` just ended with ``status``."""
    counted(tx, [(queue, status, 1)])
