"""Every verb has its conformance test: the public methods of the role Protocols
(``store/roles.py``) and of the async store, collected by introspection, against the verbs the
tests of this package declare (``kit.verb``). A new verb cannot land without one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterable
from types import ModuleType
from typing import Protocol

from workerproc.store import AsyncStore, roles
from workerproc.store.dialect import Tx
from workerproc.store.driver import VERBS, Driver
from workerproc.store.postgres.tx import PostgresTx
from workerproc.store.sqlite.dialect import SQLiteTx

# Verbs left out on purpose, each with why. The single-lease ``ack``/``compare_and_set`` are
# not on any role (the N = 1 calls of ``Driver.complete``), so nothing is listed here today.
EXEMPT: dict[str, str] = {}


def role_verbs(module: ModuleType = roles) -> set[str]:
    """The public names (methods and properties) every role Protocol of ``module`` declares."""
    found: set[str] = set()
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__ or Protocol not in getattr(cls, "__mro__", ()):
            continue
        for klass in cls.__mro__:
            if klass.__module__ == module.__name__:
                found |= {name for name in vars(klass) if not name.startswith("_")}
    return found


def driver_verbs() -> set[str]:
    """The driver's verbs (``store/driver.py``), each a ``Driver.NAME`` of the census."""
    return {f"Driver.{name}" for name in VERBS}


def async_verbs() -> set[str]:
    return {f"AsyncStore.{name}" for name, _ in inspect.getmembers(AsyncStore)
            if not name.startswith("_") and name != "url"}  # fmt: skip


def covered(modules: Iterable[ModuleType]) -> set[str]:
    """The verbs the tests of ``modules`` declare with ``@verb(...)``."""
    names: set[str] = set()
    for module in modules:
        for name, obj in vars(module).items():
            if name.startswith("test") and callable(obj):
                for mark in getattr(obj, "pytestmark", []):
                    if mark.name == "verb":
                        names |= set(mark.args)
    return names


def suite_modules() -> list[ModuleType]:
    package = importlib.import_module(__package__)
    return [importlib.import_module(f"{__package__}.{info.name}")
            for info in pkgutil.iter_modules(package.__path__)
            if info.name.startswith("test_")]  # fmt: skip


def uncovered(verbs: set[str], tested: set[str]) -> list[str]:
    return sorted(verbs - tested - set(EXEMPT))


def test_every_verb_has_a_conformance_test() -> None:
    verbs = role_verbs() | async_verbs() | driver_verbs()
    tested = covered(suite_modules())
    missing = uncovered(verbs, tested)
    assert not missing, f"verbs without a conformance test (mark one @verb(...)): {missing}"
    unknown = sorted(tested - verbs)
    assert not unknown, f"conformance tests name verbs no role has: {unknown}"


def test_the_census_sees_a_verb_added_to_a_role() -> None:
    """The check fails for a verb a role gains without a test: a role module with one more
    method than the tests cover is named."""

    class Fake(ModuleType):
        pass

    fake = Fake("fake_roles")

    class Extra(roles.WorkerStore, Protocol):
        def brand_new_verb(self) -> None: ...

    Extra.__module__ = fake.__name__
    fake.Extra = Extra  # type: ignore[attr-defined]
    verbs = role_verbs(fake)
    assert verbs == {"brand_new_verb"}
    assert uncovered(role_verbs() | verbs, covered(suite_modules())) == ["brand_new_verb"]
    assert len(role_verbs()) >= 60 and "commit_many" in role_verbs()


def test_every_driver_verb_is_implemented_by_both_drivers() -> None:
    """Each verb of the driver's interface is a method both transactions answer (none left
    abstract), declared by the interface with its contract, and none of the protocol's
    modules schedules a round trip itself (the verbs say what goes before what)."""
    assert set(VERBS) >= {"claim_rows", "renew_leases", "settle_gates", "open_gates"}
    for tx in (SQLiteTx, PostgresTx):
        assert issubclass(tx, Driver) and not tx.__abstractmethods__ & set(VERBS)
        for name in VERBS:
            assert callable(getattr(tx, name)) and getattr(Driver, name).__doc__
    assert all(getattr(Tx, name) is not getattr(Driver, name) for name in VERBS)
