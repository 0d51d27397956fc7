"""Layers point one way, read from the source's imports (``ast``, nothing is imported):

- ``workerproc`` (the worker and its store) never imports ``supervisor``;
- the store (``workerproc.store``) imports nothing of ``workerproc`` outside itself: it knows no
  handler, worker, tracing or CLI;
- the dashboard (``supervisor.web``) imports nothing of the command line (``supervisor.commands``):
  what both need lives in ``supervisor.operations``;
- a module imports no private (underscore) name of another module (but ``KNOWN_PRIVATE``).

Every import counts, also one inside a function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A module imports no private (underscore) name of another module, but for these (module, name)
# pairs. The statement modules' shared fragments are gone (their statements are written out in
# their ``queries/*.sql`` files), so none is left. The list may only shrink: a new private
# import fails.
KNOWN_PRIVATE: set[tuple[str, str]] = set()


def module_of(path: Path, root: Path) -> tuple[str, bool]:
    """``workerproc/store/newrun.py`` -> ("workerproc.store.newrun", False); a package's
    ``__init__.py`` names the package (True)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[-1] == "__init__"
    if package:
        parts.pop()
    return ".".join(parts), package


def imports(path: Path, root: Path) -> Iterator[tuple[int, str, str | None]]:
    """Every import of ``path``: (line, absolute module, name imported from it or None)."""
    name, package = module_of(path, root)
    here = name.split(".") if package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                yield node.lineno, module, alias.name


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def target(module: str, name: str | None) -> str:
    """What an import reaches: ``from workerproc import tracing`` reaches workerproc.tracing."""
    return module if name is None else f"{module}.{name}"


def violations(root: Path) -> list[str]:
    """Each import that breaks a layer rule, as ``path:line: what``."""
    found: list[str] = []

    def scan(package: str, forbidden: str, allowed: str | None = None) -> None:
        for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
            for line, module, name in imports(path, root):
                reached = target(module, name)
                if within(reached, forbidden) and not (allowed and within(reached, allowed)):
                    found.append(f"{path.relative_to(root)}:{line}: {package} imports {reached}")

    scan("workerproc", "supervisor")
    scan("workerproc.store", "workerproc", allowed="workerproc.store")
    scan("supervisor.web", "supervisor.commands")
    for package in ("workerproc", "supervisor"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for line, module, name in imports(path, root):
                private = name is not None and name.startswith("_") and not name.startswith("__")
                if private and (rel, name) not in KNOWN_PRIVATE:
                    found.append(f"{rel}:{line}: imports the private {module}.{name}")
    return found


def test_layers_point_one_way() -> None:
    assert violations(ROOT) == []


def plant(root: Path, rel: str, source: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.relative_to(root).parents:
        if str(parent) != ".":
            (root / parent / "__init__.py").touch()
    path.write_text(source, encoding="utf-8")


def test_a_planted_bad_import_is_found(tmp_path: Path) -> None:
    """The checker is not blind: each kind of wrong import, planted in a small tree, is found,
    and the imports each layer may make are not."""
    plant(tmp_path, "workerproc/tracing.py", "")
    plant(tmp_path, "workerproc/store/newrun.py",
          "from ..tracing import current_traceparent\nfrom .codec import dumps\n")  # fmt: skip
    plant(tmp_path, "workerproc/store/sqlite/dialect.py",
          "from ...backoff import backoff\nfrom ..errors import StoreError\n"
          "from workerproc.store import codec\n")  # fmt: skip
    plant(tmp_path, "workerproc/store/roles.py", "def f():\n    from workerproc import worker\n")
    plant(tmp_path, "workerproc/worker.py",
          "from .store import Store\nimport supervisor.loop\n")  # fmt: skip
    plant(tmp_path, "supervisor/web/app.py",
          "from ..commands.render import short\nfrom ..operations import actions\n")  # fmt: skip
    plant(tmp_path, "supervisor/web/views.py", "from supervisor import commands\n")
    plant(tmp_path, "workerproc/store/postgres/ops_sql.py",
          "from .sql import _CLOCK, ALIVE\nfrom __future__ import annotations\n")  # fmt: skip
    assert sorted(violations(tmp_path)) == sorted(
        [
            "workerproc/store/postgres/ops_sql.py:1: imports the private "
            "workerproc.store.postgres.sql._CLOCK",
            "workerproc/worker.py:2: workerproc imports supervisor.loop",
            "workerproc/store/newrun.py:1: workerproc.store imports "
            "workerproc.tracing.current_traceparent",
            "workerproc/store/roles.py:2: workerproc.store imports workerproc.worker",
            "workerproc/store/sqlite/dialect.py:1: workerproc.store imports "
            "workerproc.backoff.backoff",
            "supervisor/web/app.py:1: supervisor.web imports supervisor.commands.render.short",
            "supervisor/web/views.py:1: supervisor.web imports supervisor.commands",
        ]
    )
