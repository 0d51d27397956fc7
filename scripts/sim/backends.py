"""Where a schedule's database lives: SQLite in a temporary file (a migrated template copied per
schedule, on /dev/shm where there is one), or PostgreSQL in a throwaway schema of this process
(emptied per schedule, dropped at the end). Both take the simulator's clock (``open_store(...,
clock=)``): on PostgreSQL it replaces the database's ``now()`` in every statement the store
sends, so time there is the simulator's too."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from urllib.parse import urlsplit, urlunsplit

from workerproc.store import Store, open_store

from . import handlers
from .world import VClock

ADMIN = os.environ.get("LEASEKEEPER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def prepare(store: Store) -> Store:
    store.register_tasks(handlers.TASKS)
    store.declare_limits(handlers.LIMITS, by="sim")
    return store


def scratch() -> str:
    """The run's directory (on /dev/shm where there is one: fsync costs nothing there): every
    process's files go below it, and the run removes it whatever became of them."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix="lk-sim-", dir=shm)


class SQLiteBackend:
    """A database created and migrated once per process, copied for each schedule."""

    def __init__(self, root: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="p", dir=root)
        self.template = os.path.join(self.dir, "template.db")
        prepare(open_store(self.template, clock=VClock())).close()
        self.path = os.path.join(self.dir, "schedule.db")

    def open(self, clock: VClock) -> Store:
        for suffix in ("-wal", "-shm", ""):
            if os.path.exists(self.path + suffix):
                os.unlink(self.path + suffix)
        shutil.copyfile(self.template, self.path)
        return open_store(f"sqlite:///{self.path}?synchronous=normal", clock=clock)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresBackend:
    """One schema of this process's, emptied (identities restarted) before each schedule."""

    def __init__(self, tag: str) -> None:
        import psycopg  # noqa: PLC0415 - only the PostgreSQL backend needs it

        self.schema = f"{tag}_{os.getpid()}"
        self.admin = psycopg.connect(ADMIN, autocommit=True, connect_timeout=5)
        self.admin.execute(f'CREATE SCHEMA "{self.schema}"')
        parts = urlsplit(ADMIN)
        query = f"schema={self.schema}" + (f"&{parts.query}" if parts.query else "")
        self.url = urlunsplit(parts._replace(query=query))
        open_store(self.url, clock=VClock()).close()  # migrated once
        rows = self.admin.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename <> "
            "'leasekeeper_schema' ORDER BY tablename", (self.schema,)
        ).fetchall()  # fmt: skip
        self.tables = ", ".join(f'"{self.schema}"."{r[0]}"' for r in rows)
        rows = self.admin.execute(
            "SELECT sequencename FROM pg_sequences WHERE schemaname = %s ORDER BY 1",
            (self.schema,),
        ).fetchall()
        self.sequences = [f'"{self.schema}"."{r[0]}"' for r in rows]

    def open(self, clock: VClock) -> Store:
        self.admin.execute(f"TRUNCATE {self.tables} RESTART IDENTITY CASCADE")
        for sequence in self.sequences:  # (the events' order, the system's run ids)
            self.admin.execute(f"ALTER SEQUENCE {sequence} RESTART")
        return prepare(open_store(self.url, clock=clock))

    def close(self) -> None:
        self.admin.execute(f'DROP SCHEMA "{self.schema}" CASCADE')
        self.admin.close()


Backend = SQLiteBackend | PostgresBackend


def tag() -> str:
    """The prefix of this run's PostgreSQL schemas (one per process)."""
    return f"lk_sim_{os.getpid()}_{secrets.token_hex(3)}"


def backend(name: str, root: str, prefix: str) -> Backend:
    return PostgresBackend(prefix) if name == "postgres" else SQLiteBackend(root)


def clean(name: str, root: str, prefix: str) -> None:
    """Whatever the run's processes left (one stopped early leaves its files or schema)."""
    shutil.rmtree(root, ignore_errors=True)
    if name != "postgres":
        return
    import psycopg  # noqa: PLC0415

    with psycopg.connect(ADMIN, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                            (prefix + "%",)).fetchall()  # fmt: skip
        for (schema,) in rows:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
