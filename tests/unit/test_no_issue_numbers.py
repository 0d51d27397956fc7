"""Code and docs speak of rules and behaviour, not of the history that led to them: no issue
number (the word issue or issues and a number, or a hash and a number) in the code, comments,
docstrings, docs, scripts or deployment files. Why a line is the way it is belongs in git's
history. (The planted examples below are written apart, so this file names no issue either.)"""

from __future__ import annotations

import re

from source_files import text_files

CHECKED = ("workerproc", "supervisor", "scripts", "docs", "deploy", ".ci", "README.md",
           "pyproject.toml", "mkdocs.yml")  # fmt: skip
ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w&#/])#\d{1,4}\b(?![\w-])", re.I)
STYLESHEETS = (".css",)  # a hash and digits there is a colour


def issue_numbers(text: str, path: str = "") -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in ISSUE.finditer(line):
            if match.group().startswith("#") and path.endswith(STYLESHEETS):
                continue
            found.append(f"{path}:{number}: {match.group()}")
    return found


def test_no_issue_number_outside_the_tests() -> None:
    found = [hit for path, text in text_files(*CHECKED) for hit in issue_numbers(text, path)]
    assert found == []


def test_the_matcher_finds_issue_numbers() -> None:
    issue, sharp = "issue", "#"
    planted = [f"a ({issue} 24)", f"b ({issue}s 27 and 37)", f"c, {issue.title()} 19's soak",
               f"d {sharp}37", f"e {issue} {sharp}5"]  # fmt: skip
    assert [hit.split(": ", 1)[1] for hit in issue_numbers("\n".join(planted))] == [
        f"{issue} 24",
        f"{issue}s 27",
        f"{issue.title()} 19",
        f"{sharp}37",
        f"{issue} {sharp}5",
    ]
    colour = f"color: {sharp}333;"
    others = f"an {issue} with 3 parts\n{colour}\nB20 R4 v3 &{sharp}39; x{sharp}2"
    assert issue_numbers(others, "a.py") == [f"a.py:2: {sharp}333"]
    assert issue_numbers(colour, "a.css") == []
