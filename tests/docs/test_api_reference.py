"""The Python API reference (docs/reference/python.md) is complete: every public name a user
imports (``workerproc.__all__``, ``workerproc.store.__all__``'s classes a user calls) and every
public method or attribute of the classes users hold (``App``, ``Task``, ``TaskContext``,
``Store``, ``AsyncStore``) is rendered there from its docstring, and the page names nothing that
does not exist. A public name added without its reference entry fails here."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import workerproc
from workerproc import App, AsyncStore, Store, Task, TaskContext

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "python.md"
BLOCK = re.compile(r"^::: ([\w.]+)\n((?:    .*\n|\n)*)", re.MULTILINE)
MEMBER = re.compile(r"^        - (\w+)$", re.MULTILINE)
HELD = (App, Task, TaskContext, Store, AsyncStore)  # the objects users hold and call


def blocks() -> list[tuple[str, list[str] | None]]:
    """Each ``::: target`` of the page, with its ``members`` list (None: all of them)."""
    found = []
    for target, options in BLOCK.findall(PAGE.read_text()):
        members = MEMBER.findall(options) if "members:" in options else None
        found.append((target, members))
    return found


def resolve(target: str) -> Any:
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise LookupError(target)


def public(cls: type) -> set[str]:
    """The public names ``cls`` defines itself or takes from a class of ours (not from object,
    Exception or typing's protocols)."""
    names = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("workerproc"):
            continue
        names |= {n for n in vars(klass) if not n.startswith("_")}
    return names


def rendered() -> dict[int, set[str] | None]:
    """For each object the page renders (by identity), the members it renders (None: all)."""
    out: dict[int, set[str] | None] = {}
    for target, members in blocks():
        key = id(resolve(target))
        if members is None or out.get(key, set()) is None:
            out[key] = None
        else:
            out[key] = out.get(key, set()) | set(members)  # type: ignore[operator]
    return out


def test_every_block_of_the_page_names_something_that_exists() -> None:
    for target, members in blocks():
        obj = resolve(target)
        for member in members or ():
            assert hasattr(obj, member), f"{target}.{member} is on the page but not in the code"


@pytest.mark.parametrize("name", sorted(n for n in workerproc.__all__ if n != "__version__"))
def test_every_name_workerproc_exports_is_rendered(name: str) -> None:
    assert id(getattr(workerproc, name)) in rendered(), (
        f"workerproc.{name} is exported but not in docs/reference/python.md"
    )


@pytest.mark.parametrize("cls", HELD, ids=lambda c: c.__name__)
def test_every_public_member_of_what_users_hold_is_rendered_with_a_docstring(cls: type) -> None:
    shown = rendered()
    assert id(cls) in shown, f"{cls.__name__} is not in docs/reference/python.md"
    members = shown[id(cls)]
    missing = sorted(public(cls) - members) if members is not None else []
    assert not missing, f"{cls.__name__} members missing from the reference: {missing}"
    undocumented = sorted(
        n for n in public(cls) if not inspect.getdoc(getattr(cls, n)) or
        inspect.getdoc(getattr(cls, n)) == inspect.getdoc(type(getattr(cls, n)))
    )  # fmt: skip
    assert not undocumented, f"{cls.__name__} members without a docstring: {undocumented}"
