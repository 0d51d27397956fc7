"""Batch steps (docs/protocol.md B23), the store's part beyond the batch's claim
(``ClaimRequest.task``, ``claims.py``): the record of which batch call each item went in.

``batch_started``: one ``step.batched`` event per item whose lease is still live (the fence
checked per item, R2), naming the batch's call id and its size, in one small transaction: the
outbox keeps it (B18), ``supervisor show RUN`` and the dashboard read it. An item whose lease
was lost meanwhile is not recorded: it is not this batch's.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codec import check_name
from ..dialect import Dialect, Tx
from ..types import Lease
from .commits import live
from .events import emit

MAX_BATCH_ID = 64  # characters of a batch's call id


class Batches:
    dialect: Dialect

    def batch_started(self, leases: Sequence[Lease], batch: str) -> int:
        """Record that ``leases`` went in one batch call, ``batch`` (its id): a ``step.batched``
        event for each lease still live. Returns how many were recorded."""
        check_name(batch, "a batch's id")

        def record(tx: Tx) -> int:
            recorded = 0
            for lease in sorted(leases, key=lambda x: x.run_id):
                if not live(tx, lease):
                    continue
                emit(tx, "step.batched", lease.run_id, lease.task, lease.attempt, batch=batch,
                     items=len(leases), task_id=lease.task_id)  # fmt: skip
                recorded += 1
            return recorded

        return self.dialect.write(record)
