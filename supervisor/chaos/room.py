"""One look at the database for the verifier's takeover clock: could an orphaned task be
claimed right now?

An orphan can be claimed once:

1. its lease ended (released, or expired): read per task, by the verifier;
2. it is due (``available_at``, not delayed);
3. every gate of its limits has room: not paused, a concurrency slot free (the gate's live
   leases below its cap), a rate token. Tokens never hold a takeover back: the claim gives the
   predecessor's reservation back before it judges the orphan's own;
4. some worker that serves its queue has a free slot: alive by its heartbeat, running (not
   draining), holding fewer live leases than it has slots, and not a process of this host that
   is gone or stopped (a paused victim, another supervisor's, or a killed one whose row still
   looks alive).

A look reads (3) and (4) lazily, once, and only when some orphan waits: ``stats``, ``workers``,
``limits`` and ``task_options``, never a write. The gates are those the task's limits give its
payload as the limits are declared now (``gate_of``).
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Collection

import psutil

from workerproc.identity import owner_is_dead, parse_owner
from workerproc.store import Inspector, InvalidPayload, TaskInfo, TaskOptions
from workerproc.store.limits import LimitInfo, gate_of, split_gate

KEYS_READ = 1000  # a limit's keys read per look (the busiest first: waiting runs come first)


class Look:
    def __init__(self, store: Inspector, now: float, gone: Collection[str]) -> None:
        self.store = store
        self.now = now
        self.gone = gone  # owners chaos killed, or holds paused now
        self._free: list[tuple[str, ...] | None] | None = None  # each free worker's queues
        self._limits: dict[str, LimitInfo] | None = None
        self._options: dict[str, TaskOptions] | None = None

    def claimable(self, task: TaskInfo, queue: str) -> bool:
        """Whether ``task`` (of a run in ``queue``), whose lease ended, could be claimed now."""
        return task.available_at <= self.now and self.room(task) and self.served(queue)

    # -- (4) a free slot ---------------------------------------------------------------------
    def served(self, queue: str) -> bool:
        if self._free is None:
            self._free = self._free_workers()
        return any(queues is None or queue in queues for queues in self._free)

    def _free_workers(self) -> list[tuple[str, ...] | None]:
        stats = self.store.stats()
        held = Counter(lease.owner for lease in stats.leases if lease.expires_at > stats.now)
        free = []
        for w in self.store.workers():
            if not w.alive or w.state != "running" or w.owner in self.gone:
                continue
            if held[w.owner] < w.slots and not stopped_or_dead(w.owner):
                free.append(w.queues)
        return free

    # -- (3) the gates -----------------------------------------------------------------------
    def room(self, task: TaskInfo) -> bool:
        if self._options is None:
            self._options = self.store.task_options()
        declared = self._options.get(task.name)
        names = declared.limits if declared is not None and declared.limits else ()
        if not names:
            return True
        if self._limits is None:
            self._limits = {info.name: info for info in self.store.limits(keys=KEYS_READ)}
        return all(self._gate_has_room(name, task) for name in names)

    def _gate_has_room(self, name: str, task: TaskInfo) -> bool:
        assert self._limits is not None
        info = self._limits.get(name)
        if info is None:
            return True  # no such limit any more: it holds nothing back
        try:
            key = split_gate(gate_of(name, info.spec.per, task.payload))[1]
        except InvalidPayload:
            return False  # the claim fails such a run (B10): nothing to take over
        gate = next((k for k in info.keys if k.key == key), None)
        if gate is None:
            # a gate nobody used yet has room; one past the keys read cannot be told
            return len(info.keys) < KEYS_READ
        if gate.paused_until is not None:
            return False
        if info.spec.concurrency is not None and gate.live >= info.spec.concurrency:
            return False
        return gate.level is None or gate.level >= 1


def stopped_or_dead(owner: str) -> bool:
    """A worker of this host that cannot claim: gone, a zombie, or stopped (SIGSTOP). Owners
    of other hosts are never judged from here."""
    if owner_is_dead(owner):
        return True
    parsed = parse_owner(owner)
    if parsed is None or parsed.host != socket.gethostname():
        return False
    try:
        return bool(psutil.Process(parsed.pid).status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return False
