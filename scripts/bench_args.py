"""The options several ``scripts/bench`` subcommands share, written once: the PostgreSQL server,
a quick smoke run with its smaller sizes, and where the scratch files go."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"  # a server to make databases on
SERVER_VARIABLE = "LEASEKEEPER_BENCH_POSTGRES"  # overrides SERVER as the default


def add_postgres(
    ap: argparse.ArgumentParser,
    *,
    default: str | None = None,
    help: str = "a PostgreSQL server URL ('' to skip PostgreSQL)",
) -> None:
    """``--postgres URL``: by default ``$LEASEKEEPER_BENCH_POSTGRES``, else ``SERVER``."""
    ap.add_argument("--postgres", default=os.environ.get(SERVER_VARIABLE, SERVER)
                    if default is None else default, help=help)  # fmt: skip


def add_quick(
    ap: argparse.ArgumentParser,
    help: str = "a fast smoke run (not for figures)",
) -> None:
    ap.add_argument("--quick", action="store_true", help=help)


def add_dir(
    ap: argparse.ArgumentParser,
    help: str = "where the scratch directory goes (removed at the end)",
) -> None:
    ap.add_argument("--dir", help=help)


def fill_sizes(args: argparse.Namespace, sizes: Iterable[tuple[str, float, float]]) -> None:
    """Each size not given on the command line: its full value, or its quick one (``--quick``)."""
    for name, full, quick in sizes:
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
