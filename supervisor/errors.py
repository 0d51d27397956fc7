"""Errors the CLI turns into one line on stderr and an exit code (never a traceback)."""

from __future__ import annotations

from . import exitcodes


class SupervisorError(Exception):
    """A failure with a message for people and an exit code for scripts."""

    exit_code = exitcodes.ERROR

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(SupervisorError):
    """An option value that cannot work (n < 1, ttl <= 0, ...)."""

    exit_code = exitcodes.USAGE


class AppImportError(SupervisorError):
    exit_code = exitcodes.APP_LOAD


class PidfileLocked(SupervisorError):
    exit_code = exitcodes.PIDFILE_LOCKED


class NotRunning(SupervisorError):
    exit_code = exitcodes.NOT_RUNNING


class ReloadFailed(SupervisorError):
    exit_code = exitcodes.RELOAD_FAILED
