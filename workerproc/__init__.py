"""leasekeeper's worker side: the library handlers import (``App``) and the worker process."""

from __future__ import annotations

from .app import App, LeaseLost, TaskContext
from .config import WorkerConfig
from .store import CasResult, Lease, Store, open_store
from .worker import Worker

__all__ = [
    "App",
    "CasResult",
    "Lease",
    "LeaseLost",
    "Store",
    "TaskContext",
    "Worker",
    "WorkerConfig",
    "open_store",
]
