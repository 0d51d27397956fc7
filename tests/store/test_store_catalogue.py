"""The protocol is written once over named statements (``workerproc/store/dialect.py``): every
backend's catalogue must define exactly the names the protocol runs, each as SQL or a step."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from workerproc.store.dialect import STATEMENTS
from workerproc.store.postgres import steps as postgres_steps
from workerproc.store.sqlite import steps as sqlite_steps

STORE = Path(__file__).resolve().parents[2] / "workerproc" / "store"
PROTOCOL = STORE / "protocol"
# the driver's verbs, written once over named statements (``store/verbs.py``; those a program
# may ask for, as programs: ``store/starts.py``; their asks: ``store/asks.py``)
VERBS = [STORE / "verbs.py", STORE / "starts.py", STORE / "asks.py"]
CATALOGUES = {"sqlite": sqlite_steps.CATALOGUE, "postgres": postgres_steps.CATALOGUE}
RUNS = re.compile(r"^[A-Z][A-Z0-9_]*$")  # a statement's name, whole


def names_the_protocol_runs() -> set[str]:
    """Every string constant of the protocol's code that looks like a statement's name (the
    statements it runs through ``Tx.rows``/``one``/``count``/``many`` and the commit kinds'
    steps), and of the driver's verbs that run them for it."""
    found = set()
    for path in [*PROTOCOL.glob("*.py"), *VERBS]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update(RUNS.findall(node.value))
    return found


def test_both_catalogues_define_the_protocols_vocabulary() -> None:
    assert set(CATALOGUES["sqlite"]) == set(STATEMENTS)
    assert set(CATALOGUES["postgres"]) == set(STATEMENTS)


@pytest.mark.parametrize("backend", sorted(CATALOGUES))
def test_every_entry_is_sql_or_a_step(backend: str) -> None:
    for name, entry in CATALOGUES[backend].items():
        if isinstance(entry, str):
            assert entry.strip() and not entry.startswith(("{", "%")), (backend, name)
        else:
            assert callable(entry), (backend, name)


def test_the_vocabulary_is_what_the_protocol_runs() -> None:
    runs = names_the_protocol_runs()
    assert runs - STATEMENTS == set(), "the protocol runs names no catalogue defines"
    assert STATEMENTS - runs == set(), "names of the vocabulary nothing runs"
