"""docs/protocol.md cannot drift from the code: every statement, function, class, test, index and
trigger it names in backticks must exist, every statement the SQLite backend runs must be named
there, its statement index must hold the protocol's whole vocabulary (and nothing else), and
every rule's section must name the test that proves it."""

from __future__ import annotations

import ast
import inspect
import re
import sqlite3
from functools import cache
from pathlib import Path

import pytest

from workerproc.store import open_store
from workerproc.store.dialect import STATEMENTS
from workerproc.store.sqlite.steps import STEPS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
STORE = ROOT / "workerproc" / "store"
CODE_DIRS = ("workerproc", "supervisor", "tests")

SPAN = re.compile(r"`([^`\n]+)`")
STATEMENT = re.compile(r"^(sqlite|postgres)\.([A-Z_][A-Z0-9_]*)$")  # sqlite.CLAIM
# where a backend's SQL lives: its named queries (``queries/*.sql``) and these modules' constants
QUERY_NAME = re.compile(r"^-- name: ([A-Z_][A-Z0-9_]*)$", re.MULTILINE)
STATEMENT_MODULES = (
    "sql.py",
    "ops_sql.py",
    "gates_sql.py",
    "reads_sql.py",
    "schedules_sql.py",
    "calls_sql.py",
    "events_sql.py",
    "waits_sql.py",
    "webhooks_sql.py",
)
PATH_REF = re.compile(r"^([\w/.-]+\.py)(?:::([\w.:]+))?$")  # tests/x.py::Class::test
CLASS_REF = re.compile(r"^([A-Z]\w*)\.(\w+)(?:\(.*\))?$")  # Heartbeat._renew, Lease.fence
SCHEMA_REF = re.compile(r"\b(triggers?|index(?:es)?|tables?)\s+`(\w+)`")
PLURAL = {"triggers": "trigger", "indexes": "index", "tables": "table"}
PART = re.compile(r"\b[qr]\.([A-Z][A-Z0-9_]*)\b")  # how a backend's steps use its statements
NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")  # a name of the protocol's vocabulary
RULE = re.compile(r"^#{2,3} ((?:R[1-7]|B[1-9][0-9]*):)", re.MULTILINE)


def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def spans(text: str) -> list[str]:
    return SPAN.findall(text)


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """What a module or class body defines: functions, classes and assigned names."""
    found: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
    return found


def resolves(body: list[ast.stmt], dotted: list[str]) -> bool:
    """``dotted`` (Class, method, …) names something defined in ``body``."""
    node: ast.stmt | None = None
    for i, part in enumerate(dotted):
        node = names(body).get(part)
        if node is None:
            return False
        if i < len(dotted) - 1:
            if not isinstance(node, ast.ClassDef):
                return False
            body = node.body
    return True


@cache
def classes() -> dict[str, list[ast.ClassDef]]:
    """Every class of the project's code and tests, by name (a name may be defined twice)."""
    found: dict[str, list[ast.ClassDef]] = {}
    for top in CODE_DIRS:
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(tree(path)):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(node)
    return found


@cache
def queries(backend: str) -> set[str]:
    """The names of a backend's named queries (``workerproc/store/<backend>/queries/*.sql``)."""
    files = (STORE / backend / "queries").glob("*.sql")
    return {name for path in files for name in QUERY_NAME.findall(path.read_text("utf-8"))}


def missing_reference(ref: str) -> str | None:
    """Why ``ref`` names nothing, or None when it exists (or is not a reference)."""
    if m := STATEMENT.match(ref):
        modules = [STORE / m[1] / name for name in STATEMENT_MODULES]
        modules = [path for path in modules if path.is_file()]
        if not modules:
            return f"no statement module in workerproc/store/{m[1]}/"
        found = any(m[2] in names(tree(path).body) for path in modules) or m[2] in queries(m[1])
        return None if found else f"the {m[1]} backend has no statement {m[2]}"
    if m := PATH_REF.match(ref):
        path = ROOT / m[1]
        if "/" not in m[1] and m[2] is None:  # a bare file name: somewhere in the project
            hits = [p for top in CODE_DIRS for p in (ROOT / top).rglob(m[1])]
            return None if hits else f"no file named {m[1]}"
        if not path.is_file():
            return f"no file {m[1]} (cite it by its path from the repository root)"
        if m[2] is None:
            return None
        dotted = [p for part in m[2].split("::") for p in part.split(".")]
        return None if resolves(tree(path).body, dotted) else f"{m[1]} defines no {m[2]}"
    if m := CLASS_REF.match(ref):
        defs = classes().get(m[1])
        if not defs:
            return f"no class {m[1]}"
        return None if any(m[2] in names(c.body) for c in defs) else f"{m[1]} has no {m[2]}"
    return None


def test_every_reference_names_something_that_exists() -> None:
    refs = spans(doc())
    broken = sorted({f"`{r}`: {why}" for r in refs if (why := missing_reference(r))})
    assert not broken, "docs/protocol.md names what does not exist:\n" + "\n".join(broken)
    # the patterns really matched: a changed notation must not silently check nothing
    assert sum(bool(STATEMENT.match(r)) for r in refs) >= 50
    assert sum(r.startswith("tests/") and "::" in r for r in refs) >= 80
    assert sum(bool(CLASS_REF.match(r)) for r in refs) >= 40


def test_every_index_and_trigger_named_is_in_the_sqlite_schema(tmp_path: Path) -> None:
    sqlite_part = doc().split("\n## PostgreSQL", 1)[0]  # another backend's section names its own
    named = {(PLURAL.get(kind, kind), name) for kind, name in SCHEMA_REF.findall(sqlite_part)}
    open_store(str(tmp_path / "schema.db")).close()
    with sqlite3.connect(tmp_path / "schema.db") as conn:
        schema = set(conn.execute("SELECT type, name FROM sqlite_master").fetchall())
    conn.close()
    assert named - schema == set(), "docs/protocol.md names schema objects SQLite does not have"
    assert {kind for kind, _ in named} >= {"trigger", "index", "table"}


def sqlite_runs() -> set[str]:
    """Every SQL constant the SQLite backend runs: its catalogue's plain statements (the
    vocabulary less its steps) and the statements its steps run (in every module that defines
    one of them)."""
    files = sorted({inspect.getsourcefile(step) or "" for step in STEPS.values()})
    steps = "".join(Path(path).read_text(encoding="utf-8") for path in files)
    return (set(STATEMENTS) - set(STEPS)) | set(PART.findall(steps))


def test_every_statement_the_sqlite_backend_runs_is_documented() -> None:
    documented = {m[2] for r in spans(doc()) if (m := STATEMENT.match(r)) and m[1] == "sqlite"}
    used = sqlite_runs()
    steps = {"CAS_FINISH", "RUN_STATES", "CHECK_FENCE"}
    assert steps <= used, "the steps changed: update this test"
    assert used - documented == set(), "statements missing from docs/protocol.md"


def test_the_statement_index_holds_the_whole_vocabulary() -> None:
    index = doc().split("\n## Statement index", 1)[1].split("\n## ", 1)[0]
    named = {r for r in spans(index) if NAME.match(r)}
    assert named - STATEMENTS == set(), "the index names what the protocol does not run"
    assert STATEMENTS - named == set(), "names of the vocabulary missing from the index"


def sections() -> dict[str, str]:
    text = doc().split("\n## PostgreSQL", 1)[0]  # the other backend's section has its own
    marks = list(RULE.finditer(text))
    found_marks = [m[1] for m in marks]
    numbers = [int(m[1:-1]) for m in found_marks[7:]]
    assert found_marks[:7] == [f"R{i}:" for i in range(1, 8)], "R1-R7 first, in order"
    assert numbers == sorted(set(numbers)) and set(range(1, 13)) <= set(numbers), (
        "docs/protocol.md must have R1-R7, then B1-B12 and any later B<n>, in order"
    )
    found = {}
    for mark, after in zip(marks, [*marks[1:], None], strict=True):
        end = after.start() if after else text.index("\n## ", mark.end())
        found[mark[1].rstrip(":")] = text[mark.end() : end]
    return found


@pytest.mark.parametrize(
    "rule", [m[1].rstrip(":") for m in RULE.finditer(doc().split("\n## PostgreSQL", 1)[0])]
)
def test_every_rule_names_its_statements_code_and_proof(rule: str) -> None:
    body = sections()[rule]
    refs = spans(body)
    assert "**SQLite statements:**" in body, f"{rule}: which statement enforces it?"
    assert any((m := STATEMENT.match(r)) and m[1] == "sqlite" for r in refs), (
        f"{rule}: no SQLite statement named"
    )
    assert "**Python:**" in body and "**Proof:**" in body, f"{rule}: Python or Proof missing"
    proof = body.split("**Proof:**", 1)[1]
    assert any(r.startswith("tests/") and "::" in r for r in spans(proof)), f"{rule}: no test"


def test_the_postgresql_section_comes_last() -> None:
    headings = re.findall(r"^## (.+)$", doc(), re.MULTILINE)
    assert headings[-1] == "PostgreSQL"
