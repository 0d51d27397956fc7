"""The reference tables of README.md and of the docs site are generated from the code's
declarations: a change to an option, a range or an exit code that is not written back into the
pages fails here (run ``scripts/readme-tables`` to rewrite them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.commands.reference import TABLES, names_in, render

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The README keeps the card a visitor needs; the site holds every table.
IN_README = {"start-options", "exit-codes"}


def pages_with_tables() -> list[Path]:
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if names_in(p.read_text(encoding="utf-8"))]


def test_every_generated_table_is_in_the_site_and_the_readme_keeps_its_own() -> None:
    in_site = set()
    for page in pages_with_tables():
        if page != README:
            in_site |= names_in(page.read_text(encoding="utf-8"))
    assert in_site == set(TABLES)
    assert names_in(README.read_text(encoding="utf-8")) == IN_README


@pytest.mark.parametrize("page", pages_with_tables(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_tables_match_the_declarations(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert render(text) == text, f"{page.name}: tables are stale: run scripts/readme-tables"


def test_a_changed_declaration_makes_the_tables_stale() -> None:
    text = README.read_text(encoding="utf-8")
    tampered = text.replace("| `--lease-ttl S` | `SUPERVISOR_LEASE_TTL` | 60 |", "| x | y | 1 |")
    assert tampered != text
    assert render(tampered) == text


def test_the_default_worker_count_reads_the_same_everywhere() -> None:
    """-n's default is the CPU count in the option table, and no page claims another."""
    assert "| `-n`, `--workers N` | `SUPERVISOR_WORKERS` | the CPU count |" in README.read_text()
    for page in [README, *(ROOT / "docs").rglob("*.md")]:
        text = page.read_text(encoding="utf-8").lower()
        for claim in ("default `-n 8`", "-n 8 (default)", "default -n 8", "default -n 1"):
            assert claim not in text, f"{page.name}: {claim!r}"
