"""An app named by its spec (``package.module:attr``), as ``--app`` gives it: imported, checked
to be a ``workerproc.App``, its schedules checked against its tasks. Apart from the worker, so
that what only names the error (the CLI's error handling) loads no worker."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .app import App


class AppLoadError(Exception):
    """The app spec cannot be imported or does not name an App."""


def load_app(spec: str) -> App:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app must look like package.module:attr, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the current directory is importable
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppLoadError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    try:
        app = getattr(module, attr)
    except AttributeError:
        raise AppLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    from .app import App  # noqa: PLC0415 - what a worker imports anyway

    if not isinstance(app, App):
        raise AppLoadError(f"{spec} is a {type(app).__name__}, not a workerproc.App")
    try:
        app.schedule_specs()  # every schedule names a task the app registers
        app.check_versions()  # every migration chain reaches its task's version (B25)
    except ValueError as exc:
        raise AppLoadError(f"{spec}: {exc}") from None
    return app
