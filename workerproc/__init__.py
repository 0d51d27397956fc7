"""leasekeeper's worker side: the library handlers import (``App``) and the worker process."""

from __future__ import annotations

# The one place the version is written: pyproject.toml reads it (setuptools' dynamic version),
# and so does everything that reports it.
__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import App, LeaseLost, RunCancelled, Task, TaskContext
    from .batching import Batch
    from .config import WorkerConfig
    from .emitting import StreamFull
    from .limits import RetryAfter
    from .once import OnceCall
    from .store import (
        AsyncStore,
        CasResult,
        Lease,
        Store,
        TaskOptions,
        open_async_store,
        open_store,
    )
    from .worker import Worker

# Each public name from the module that defines it, imported at its first use: a command that
# only asks the version (``supervisor --version``), or a worker's own import of a submodule,
# does not pay for the whole library (the store's backends, the worker, the async store).
_WHERE = {
    "App": "app", "LeaseLost": "app", "RunCancelled": "app", "Task": "app",
    "TaskContext": "app", "Batch": "batching", "WorkerConfig": "config", "StreamFull": "emitting",
    "RetryAfter": "limits", "OnceCall": "once", "AsyncStore": "store", "CasResult": "store",
    "Lease": "store", "Store": "store", "TaskOptions": "store", "open_async_store": "store",
    "open_store": "store", "Worker": "worker",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "App",
    "AsyncStore",
    "Batch",
    "CasResult",
    "Lease",
    "LeaseLost",
    "OnceCall",
    "RetryAfter",
    "RunCancelled",
    "Store",
    "StreamFull",
    "Task",
    "TaskContext",
    "TaskOptions",
    "Worker",
    "WorkerConfig",
    "__version__",
    "open_async_store",
    "open_store",
]
