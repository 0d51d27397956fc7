"""The conformance suite's one fixture: ``driver``, each backend in turn (``sqlite``, and
``postgres`` marked ``postgres``), a fresh database per test and a clock moved by hand."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from helpers import FakeClock
from store_backends import BACKENDS, Backend, PgBouncerBackend

from .kit import Driver


@pytest.fixture(
    params=[pytest.param("sqlite", id="sqlite"),
            pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
            # the whole suite again through PgBouncer in transaction mode (scripts/test-e2e)
            pytest.param("pgbouncer", id="postgres-pgbouncer",
                         marks=[pytest.mark.postgres, pytest.mark.pgbouncer, pytest.mark.e2e])]
)  # fmt: skip
def driver(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[Driver]:
    clock = FakeClock()
    backend: Backend
    if request.param == "pgbouncer":
        bouncer = request.getfixturevalue("pgbouncer")
        backend = PgBouncerBackend(os.fspath(tmp_path), bouncer.url)
    else:
        backend = BACKENDS[request.param](os.fspath(tmp_path))
    d = Driver(request.param, backend, clock, backend.open(clock))
    try:
        yield d
    finally:
        d.close()
