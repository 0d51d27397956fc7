"""leasekeeper's worker side: the library handlers import (``App``) and the worker process."""

from __future__ import annotations

# The one place the version is written: pyproject.toml reads it (setuptools' dynamic version),
# and so does everything that reports it.
__version__ = "0.1.0"

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
    "__version__",
    "open_store",
]
