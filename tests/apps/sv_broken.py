"""An app module that cannot be imported: the supervisor must say so in one line."""

from __future__ import annotations

raise RuntimeError("this app is broken on purpose")
