"""Test app of the batch-step chaos soak (tests/chaos/test_batch_chaos.py): one batch step whose
provider bills per call, judged by an OUTSIDE ledger the handler writes.

Each call of the step appends JSON lines to the O_APPEND file its items' payload names
(``ledger``; tests/apps/ledger_app.py's ``note``, one ``os.write`` each): ``bill`` when the
provider is called (its call id, a nonce no other call has, and the items it bills), and
``once`` with what ``batch.once`` answered each item (the call whose answer it got), ``ask``
right before ``batch.once`` looks for kept answers. The ledger
sees calls the database never heard of (a worker killed in the provider's call).
"""

from __future__ import annotations

import random
import secrets
import time
from typing import Any

from apps.ledger_app import note
from workerproc import App, Batch

app = App()


@app.task(batch=64, batch_wait=0.5, max_attempts=20)
def embed(batch: Batch) -> None:
    path = str(batch[0].payload["ledger"])
    rng = random.Random()

    def provider(items: list[Any]) -> list[Any]:
        call = secrets.token_hex(8)
        note(path, "bill", {"call": call, "items": items, "batch": batch.id})
        time.sleep(rng.uniform(0.05, 0.3))  # the provider's time: chaos may strike in it
        return [{"call": call, "item": i} for i in items]

    note(path, "ask", {"batch": batch.id})  # before batch.once looks for kept answers
    answers = batch.once("embed", [c.payload["i"] for c in batch], provider)
    got = [[c.payload["i"], a["call"]] for c, a in zip(batch, answers, strict=True) if a]
    note(path, "once", {"batch": batch.id, "got": got})
    time.sleep(rng.uniform(0.0, 0.1))  # work after the call: chaos may strike here too
    for ctx, answer in zip(batch, answers, strict=True):
        if answer is not None:
            ctx.finish({"vector": answer})
