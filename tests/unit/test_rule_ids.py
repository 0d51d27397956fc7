"""Rule ids (R1 to R7, B1 to B…) are names docs/protocol.md defines: every id that code, docs or
tests cite is defined there, each exactly once (a heading ``## R1: …`` or ``### B12: …``), and the
page's opening line names the ranges it defines."""

from __future__ import annotations

import re

from source_files import ROOT, text_files

PROTOCOL = "docs/protocol.md"
CITING = ("workerproc", "supervisor", "scripts", "docs", "tests", "deploy", "README.md")
# R3, B12, each end of a range (R1 to R7, with an en dash); not a linter's code (``noqa: B018``,
# three digits)
CITED = re.compile(r"(?<![\w-])([RB][1-9][0-9]?)(?![\w-])")
DEFINED = re.compile(r"^#{2,3} ([RB][1-9][0-9]?): ", re.M)
RANGES = re.compile(r"\*\*([RB])1\N{EN DASH}\1([1-9][0-9]?)\*\*")


def cited_ids(text: str) -> set[str]:
    return {m for line in text.splitlines() if "noqa" not in line for m in CITED.findall(line)}


def definitions() -> list[str]:
    return DEFINED.findall((ROOT / PROTOCOL).read_text(encoding="utf-8"))


def test_each_rule_is_defined_once() -> None:
    defined = definitions()
    assert defined, "no rule heading found"
    twice = sorted({i for i in defined if defined.count(i) > 1})
    assert twice == [], f"{PROTOCOL} defines these more than once: {twice}"


def test_the_opening_names_the_ranges_defined() -> None:
    text = (ROOT / PROTOCOL).read_text(encoding="utf-8")
    ranges = {f"{kind}{n}" for kind, top in RANGES.findall(text) for n in range(1, int(top) + 1)}
    assert ranges == set(definitions())


def test_every_cited_rule_id_is_defined() -> None:
    defined = set(definitions())
    unknown = sorted(
        f"{path}: {rule}"
        for path, text in text_files(*CITING)
        for rule in cited_ids(text) - defined
    )
    assert unknown == [], f"rule ids cited but not defined in {PROTOCOL}"


def test_a_citation_is_told_from_other_names() -> None:
    """The matcher finds rule ids and only those."""
    assert cited_ids("fenced (R2, R5, B3); rules R1\N{EN DASH}R7 and B1\N{EN DASH}B20") == {
        "R2", "R5", "B3", "R1", "R7", "B1", "B20"}  # fmt: skip
    assert cited_ids("x  # noqa: B018\nB011 B904 RB1 R2D2 SHA-B1 a-R3 v1") == set()
    beyond = "B" + "21"  # (written apart: this file cites only defined ids)
    assert cited_ids(f"see {beyond}.") == {beyond}
