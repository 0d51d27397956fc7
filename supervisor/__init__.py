"""The supervisor: a parent process that forks, watches and stops ``workerproc`` workers."""

from __future__ import annotations

__all__: list[str] = []
