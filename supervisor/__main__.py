"""``python -m supervisor``: the same entry point as the ``supervisor`` console script."""

from __future__ import annotations

from .commands.cli import main

if __name__ == "__main__":
    main()
