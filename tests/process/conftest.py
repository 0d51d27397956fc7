"""Fixtures of the real-worker process tests: a work directory and the workers to kill after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import Proc


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()
