"""The lease protocol written once (docs/protocol.md, R1-R7 and B1-B24), over a ``Dialect``:
claims (``claims``), fenced commits (``commits``), what lease holders call (``leases``),
producers, operators (and their bulk writes, ``bulk``), forks (``forks``), reads, the per-task
options (``tasks``), the worker list (``workers``), schedules (``schedules``), paid calls
(``calls``), the outbox (``events``), webhooks (``webhooks``), runs' streams
(``streams``) and batch steps' records (``batches``). ``Store`` is all of it; callers depend
on the part they use (``store/roles.py``)."""

from __future__ import annotations

from ..dialect import Dialect
from .batches import Batches
from .bulk import Bulk
from .calls import Calls
from .events import Events
from .forks import Forks
from .leases import Leases
from .limits import Limits
from .operators import Operators
from .producers import Producers
from .reads import Reads
from .schedules import Schedules
from .streams import Streams
from .tasks import Tasks
from .waits import Waits
from .webhooks import Webhooks
from .workers import Workers


class Store(
    Leases, Producers, Forks, Operators, Bulk, Reads, Tasks, Workers, Schedules, Limits, Calls,
    Events, Waits, Webhooks, Streams, Batches,
):  # fmt: skip
    """Runs and tasks under leases, on one database (``open_store`` picks its dialect). Every
    fenced call matches task id, owner and attempt and requires the lease to be live; the
    store reads "now" only once it holds the write lock."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.url = dialect.url

    def close(self) -> None:
        """Close this store's connections (this thread's, and the change listener's); a
        ``with open_store(...) as store:`` block does it on leaving."""
        self.dialect.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Store"]
