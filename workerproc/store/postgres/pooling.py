"""How the PostgreSQL store reaches its server: straight, or through a pooler in transaction mode
(PgBouncer's ``pool_mode = transaction``, ``?pooler=transaction`` in the URL).

Behind such a pooler a client's transactions may each run on another server session, and the
pooler refuses what a session would keep: startup options (PgBouncer: "unsupported startup
parameter: options"), prepared statements (PgBouncer before 1.21, or without
``max_prepared_statements``), LISTEN. So the store then keeps nothing in a session: each
transaction sets our bounds and planner settings for itself (``SET LOCAL`` in the query of its
``BEGIN``), nothing is prepared, and wake-ups come either from LISTEN on a connection straight
to the server (``listen=direct`` with ``listen_host``/``listen_port``) or from polling the
server's snapshot (``listen=poll``, the default behind a pooler: ``Poller``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from urllib.parse import urlencode

from psycopg.conninfo import make_conninfo

from ..errors import InvalidOption, StoreError
from ..settings import PostgresOptions

# How often a poller reads the server's snapshot while a worker waits (one statement, no
# transaction): the bound on an idle worker's wake-up behind a pooler without a direct LISTEN.
POLL = 0.1


def settings(schema: str, busy_timeout: float, idle_in_transaction: float) -> dict[str, str]:
    """What every session of ours runs with (startup options straight to the server; SET
    LOCAL in each transaction behind a pooler)."""
    return {
        "search_path": schema,  # (a name of [a-z0-9_]: settings.SCHEMA_NAME)
        "lock_timeout": str(int(busy_timeout * 1000)),
        "idle_in_transaction_session_timeout": str(max(10, int(idle_in_transaction * 1000))),
        # every statement of ours is a bounded index walk; after a bulk enqueue the planner
        # would otherwise read every pending run per claim, and plan the claim's probe of a
        # run's lease as a scan of the whole leases heap, which grows with dead rows between
        # vacuums (docs/protocol.md). No JIT: a statement that can only scan (a small table
        # without an index for it) is costed past jit_above_cost with sequential scans off,
        # and compiling it took 200-300 ms
        "enable_bitmapscan": "off",
        "enable_seqscan": "off",
        "jit": "off",
    }


def begins(local: dict[str, str]) -> dict[str, str]:
    """The query that opens a transaction of each mode; behind a transaction pooler each one
    sets ``local`` for itself (SET LOCAL: they end with it), in the query of its BEGIN, so
    they cost no round trip of their own."""
    sets = "".join(f"; {one}" for one in set_local(local))
    plain = "BEGIN" + sets
    return {"snapshot": "BEGIN ISOLATION LEVEL REPEATABLE READ" + sets, "write": plain,
            "read": plain, "statement": plain}  # fmt: skip


def set_local(local: dict[str, str]) -> list[str]:
    """A ``SET LOCAL`` for each of ``local``."""
    return [f"SET LOCAL {name} = {value}" for name, value in local.items()]


def reopen_query(options: PostgresOptions) -> str:
    """Our options a URL needs to open the same schema the same way again."""
    ours: dict[str, object] = {"schema": options.schema}
    for name in ("pooler", "listen", "listen_host", "listen_port"):
        if (value := getattr(options, name)) not in (None, "none"):
            ours[name] = value
    return urlencode(ours)


def pooled(options: PostgresOptions) -> bool:
    """Whether a transaction pooler sits between (and the options agree with that)."""
    behind = options.pooler == "transaction"
    if not behind and (options.listen_host is not None or options.listen_port is not None):
        raise InvalidOption(
            "listen_host and listen_port are for pooler=transaction (LISTEN straight to the "
            "server); without a pooler the store listens on its own URL"
        )
    return behind


def listen_at(conninfo: str, options: PostgresOptions) -> str | None:
    """Where the LISTEN connection goes (None: poll instead). Behind a pooler, ``listen=direct``
    needs the server's own address: LISTEN through a transaction pooler hears nothing."""
    if options.pooler != "transaction":
        if options.listen == "poll":
            return None
        return conninfo
    if (options.listen or "poll") == "poll":
        if options.listen_host is not None or options.listen_port is not None:
            raise InvalidOption("listen_host and listen_port are for listen=direct")
        return None
    if options.listen_host is None and options.listen_port is None:
        raise InvalidOption(
            "pooler=transaction with listen=direct needs listen_port (and listen_host unless "
            "the server is on the pooler's host): LISTEN through a transaction pooler hears "
            "nothing"
        )
    direct: dict[str, str | int] = {}
    if options.listen_host is not None:
        direct["host"] = options.listen_host
    if options.listen_port is not None:
        direct["port"] = options.listen_port
    return make_conninfo(conninfo, **direct)


class Poller:
    """Wake-ups without LISTEN: a token that moves when the server's snapshot did (a
    transaction anywhere on the server ended), read at most every ``POLL`` seconds. A change
    may be someone else's (a waiter then looks and sleeps again); none is missed, since a commit
    of ours ends a transaction and so changes the snapshot. Errors move the token too (look
    again: something may have changed while the server could not say)."""

    def __init__(self, snapshot: Callable[[], str]) -> None:
        self._snapshot = snapshot
        self._seen: str | None = None
        self._count = 0
        self._read_at = -POLL
        self._lock = threading.Lock()

    def token(self, channel: str | None = None) -> int:
        with self._lock:
            if time.monotonic() - self._read_at >= POLL:
                self._read_at = time.monotonic()
                try:
                    now: str | None = self._snapshot()
                except StoreError:
                    now = None
                if now is None or now != self._seen:
                    self._count += 1
                self._seen = now
            return self._count

    def wait(self, token: int, timeout: float, channel: str | None = None) -> int:
        deadline = time.monotonic() + timeout
        while (current := self.token(channel)) == token:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, POLL))
        return current

    def socket(self) -> int | None:
        return None

    def idle_over(self) -> None:
        """Nothing to stop: polling happens only while someone waits."""

    def abandon(self) -> None:
        self._lock = threading.Lock()  # a lock held by a parent's thread would never be freed

    def close(self) -> None:
        """Nothing open: each look is a statement of the store's own connection."""
