"""Runs' streams in the simulation (docs/protocol.md B21): a handler's ``emit`` steps write
batches of chunks through the real store (``append_stream``, as the worker's stream thread
does, ``after`` the end of its previous batch), and the stream is judged from outside after
every accepted batch and at the end: offsets without a gap, a ``reset`` exactly where another
attempt of the step takes over, never a silent splice, and a succeeded step's final stream (after
its last reset) exactly the chunks its committing attempt wrote."""

from __future__ import annotations

from workerproc.store import Lease, Store
from workerproc.store.protocol.streams import chunk_text
from workerproc.store.streams import Appended

from .world import Ledger, Violation

STREAM = "a stream has no gap and no splice"
PER_BATCH = 2  # chunks a simulated emit step writes


def texts(lease: Lease, written: int) -> list[str]:
    """The next batch of an execution that wrote ``written`` chunks before: the same for the
    same attempt, so a batch tried again is the same batch."""
    return [chunk_text({"a": lease.attempt, "n": written + i}) for i in range(PER_BATCH)]


def judge(store: Store, ledger: Ledger, lease: Lease, out: Appended, now: float) -> None:
    """An accepted batch came from the task's live holder, and the run's stream, read on from
    what was seen, is whole."""
    if out.outcome != "written":
        return
    holder = ledger.latest.get(lease.task_id)
    expiry = ledger.granted.get((lease.task_id, lease.attempt), 0.0)
    if holder != lease.attempt or expiry < now:
        raise Violation("no write by a non-holder",
                        f"task {lease.task_id}: a stream batch of attempt {lease.attempt} was "
                        f"accepted; the holder is attempt {holder}")  # fmt: skip
    read(store, ledger, lease.run_id)


def read(store: Store, ledger: Ledger, run_id: int) -> None:
    seen = ledger.stream_seen.get(run_id, 0)
    last = ledger.stream_last.get(run_id)
    for chunk in store.stream(run_id, after=seen, limit=1000):
        if chunk.offset != seen + 1:
            raise Violation(STREAM, f"run {run_id}: offset {chunk.offset} after {seen}")
        other = last is not None and last[0] == chunk.step and last[1] != chunk.attempt
        if chunk.kind == "reset" and not other:
            raise Violation(STREAM, f"run {run_id}: a reset at {chunk.offset} without a takeover")
        if chunk.kind != "reset" and other:
            raise Violation(STREAM, f"run {run_id}: attempt {chunk.attempt} spliced on at "
                                    f"{chunk.offset} without a reset")  # fmt: skip
        seen, last = chunk.offset, (chunk.step, chunk.attempt)
    ledger.stream_seen[run_id] = seen
    if last is not None:
        ledger.stream_last[run_id] = last


def at_end(store: Store, ledger: Ledger) -> None:
    """A step whose committing attempt emitted: its final stream, after its last reset, is
    exactly what that attempt wrote."""
    for task_id, attempt in sorted(ledger.committed.items()):
        wrote = ledger.stream_written.get((task_id, attempt))
        run_id = ledger.run_of.get(task_id)
        if not wrote or run_id is None or store.get_run(run_id) is None:
            continue
        read(store, ledger, run_id)
        mine = [c for c in store.stream(run_id, 0, 100_000) if c.step == task_id]
        resets = [i for i, c in enumerate(mine) if c.kind == "reset"]
        final = mine[resets[-1] + 1 :] if resets else mine
        got = [(c.attempt, chunk_text(c.data)) for c in final]
        if got != [(attempt, text) for text in wrote]:
            raise Violation(STREAM, f"task {task_id}: its final stream is {len(got)} chunks, "
                                    f"not the {len(wrote)} its committing attempt {attempt} "
                                    "wrote")  # fmt: skip
