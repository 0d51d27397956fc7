"""leasekeeper's worker side: the library handlers import (``App``) and the worker process."""

from __future__ import annotations

# The one place the version is written: pyproject.toml reads it (setuptools' dynamic version),
# and so does everything that reports it.
__version__ = "0.1.0"

from .app import App, LeaseLost, RunCancelled, Task, TaskContext
from .batching import Batch
from .config import WorkerConfig
from .emitting import StreamFull
from .limits import RetryAfter
from .once import OnceCall
from .store import AsyncStore, CasResult, Lease, Store, TaskOptions, open_async_store, open_store
from .worker import Worker

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
