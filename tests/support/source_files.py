"""The project's own text files, for the tests that read the source as text (rule ids, issue
numbers): every UTF-8 file under the given top-level paths, without caches and binaries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}
BINARY = {".png", ".jpg", ".jpeg", ".gif", ".ico", ".svg", ".woff", ".woff2", ".pyc", ".db"}


def text_files(*tops: str) -> Iterator[tuple[str, str]]:
    """(path relative to the repository, text) of each text file under ``tops``."""
    for top in tops:
        start = ROOT / top
        paths = [start] if start.is_file() else sorted(start.rglob("*"))
        for path in paths:
            rel = path.relative_to(ROOT)
            if not path.is_file() or path.suffix in BINARY or SKIPPED_DIRS & set(rel.parts):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            yield rel.as_posix(), text
