"""The database file as it was when it was pinned: a path that later names another file (the
file deleted, a backup restored over it, a new empty file made there) is noticed with one
``stat``. The supervisor stops its pool on it (``loop.guard``); the dashboard stops showing pages
and refuses actions. Never open the path again then: opening it would create an empty database
or serve another one as if it were ours."""

from __future__ import annotations

import os


class PinnedFile:
    def __init__(self, path: str | None) -> None:
        self.path = path  # None: a server database (PostgreSQL), nothing to watch
        self.identity: tuple[int, int] | None = None  # (device, inode)

    def pin(self) -> None:
        """Remember which file the path names now (OSError when it names none)."""
        if self.path is not None:
            st = os.stat(self.path)
            self.identity = (st.st_dev, st.st_ino)

    def problem(self, user: str) -> str | None:
        """Why the path no longer names the pinned file (``user`` was using it), or None.
        Unpinned, or a path that cannot be looked at (permissions): None."""
        if self.identity is None or self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"the database file {self.path} was deleted while {user} was using it"
        except OSError:
            return None  # cannot look: the sessions will say more
        if (st.st_dev, st.st_ino) != self.identity:
            return (
                f"the database file {self.path} was replaced by another file while {user} "
                f"was using it (inode {self.identity[1]} -> {st.st_ino})"
            )
        return None
