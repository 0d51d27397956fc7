"""A backend's SQL as named queries in ``.sql`` files (``<backend>/queries/*.sql``), one
described query per block, read through the package's loader and checked when the module that
loads them is imported::

    -- name: GET_RUN
    -- A run by its id, its status as people see it.
    SELECT ... FROM runs WHERE id = :run_id

A block is a ``-- name: NAME`` line, one or more ``-- `` lines that describe it, then its SQL
(no comment lines inside it). A file may open with comment lines of its own. Every name appears
once per file, and is a name of the protocol's vocabulary (``dialect.STATEMENTS``) or one the
backend declares for its own steps (``internal``). Parameters are written in the backend's
driver's style (``named``: SQLite's ``:x``, or ``?`` alone; ``pyformat``: psycopg's
``%(x)s``); ``{field}`` is allowed only for the fields the loader is told of (a schema prefix,
say: the module that loads such a query formats it). Anything else is an error at import,
naming the file and the line.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .dialect import STATEMENTS
from .records import record

Style = Literal["named", "pyformat"]

_NAME_LINE = re.compile(r"^--\s*name:\s*(?P<name>\S*)\s*$")
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PERCENT = re.compile(r"%%|%\((?P<param>[A-Za-z_][A-Za-z0-9_]*)\)s|%")
_BRACE = re.compile(r"\{(?P<field>[A-Za-z_][A-Za-z0-9_]*)\}|[{}]")
# what the text of a query is made of, outside its quoted parts: string literals, quoted
# identifiers and dollar-quoted bodies are passed over whole
_QUOTED = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$(?P<tag>[A-Za-z_]*)\$.*?\$(?P=tag)\$", re.S
)


class QueryFileError(ValueError):
    """A ``.sql`` file of the store is malformed: which file, which line, what is wrong."""

    def __init__(self, source: str, line: int, message: str) -> None:
        super().__init__(f"{source}:{line}: {message}")
        self.source = source
        self.line = line


@record
class Query:
    """One named query of a ``.sql`` file."""

    name: str
    description: str
    sql: str
    params: frozenset[str]  # the named parameters it takes ("?": positional ones)
    fields: frozenset[str]  # the ``{field}``s its loader formats
    line: int  # where its ``-- name:`` line is


def parse(
    text: str, *, source: str, style: Style, known: Iterable[str] = STATEMENTS,
    fields: Iterable[str] = (),
) -> dict[str, Query]:  # fmt: skip
    """The queries of one file's ``text``, by name, in file order; ``QueryFileError`` for the
    first thing wrong (``source``: the file, for the message)."""
    names, allowed = frozenset(known), frozenset(fields)
    found: dict[str, Query] = {}
    block: tuple[str, int] | None = None
    described: list[str] = []
    body: list[tuple[int, str]] = []

    def close() -> None:
        if block is None:
            return
        name, line = block
        if not described:
            raise QueryFileError(source, line, f"query {name} has no description (-- lines)")
        while body and not body[-1][1].strip():
            body.pop()
        if not body:
            raise QueryFileError(source, line, f"query {name} has no SQL")
        sql = "\n".join(t.rstrip() for _, t in body)
        params, used = _check(sql, source=source, first=body[0][0], style=style, fields=allowed)
        found[name] = Query(name, " ".join(described), sql, params, used, line)

    for number, raw in enumerate(text.splitlines(), start=1):
        header = _NAME_LINE.match(raw.strip())
        if header:
            close()
            name = header["name"]
            if not _NAME.match(name):
                raise QueryFileError(source, number, f"{name!r} is not a query name (A_NAME)")
            if name in found or (block is not None and block[0] == name):
                first = found[name].line if name in found else number
                raise QueryFileError(source, number, f"query {name} is named twice (line {first})")
            if name not in names:
                raise QueryFileError(source, number, f"query {name} is not a statement we know")
            block, described, body = (name, number), [], []
            continue
        stripped = raw.strip()
        if block is None:  # the file's own opening comment
            if stripped and not stripped.startswith("--"):
                raise QueryFileError(source, number, "SQL before the first '-- name:' line")
            continue
        if stripped.startswith("--"):
            if body and any(t.strip() for _, t in body):
                raise QueryFileError(
                    source, number, f"a comment inside query {block[0]}: describe it above its SQL"
                )
            if stripped[2:].strip():
                described.append(stripped[2:].strip())
            continue
        if not body and not stripped:
            continue
        body.append((number, raw))
    close()
    return found


def _check(
    sql: str, *, source: str, first: int, style: Style, fields: frozenset[str]
) -> tuple[frozenset[str], frozenset[str]]:
    """The parameters and fields of one query's SQL, checked for its driver's style."""

    def fail(offset: int, message: str) -> QueryFileError:
        return QueryFileError(source, first + sql.count("\n", 0, offset), message)

    params: set[str] = set()
    used: set[str] = set()
    positional = False
    position = 0
    for m in [*_QUOTED.finditer(sql), None]:
        end = len(sql) if m is None else m.start()
        chunk = sql[position:end]
        for f in _BRACE.finditer(chunk):
            if f["field"] is None or f["field"] not in fields:
                raise fail(position + f.start(), "a brace that is no field this query may have")
            used.add(f["field"])
        if style == "pyformat":
            for p in _PERCENT.finditer(chunk):
                if p.group() == "%":
                    raise fail(position + p.start(), "a '%' that is no %(name)s parameter (%%)")
                if p["param"]:
                    params.add(p["param"])
            for c in re.finditer(r"(?<![:\w]):(?!:)", chunk):
                if _IDENT.match(chunk, c.end()):
                    raise fail(position + c.start(), "a :name parameter in a %(name)s file")
        else:
            if "%(" in chunk:
                raise fail(position + chunk.index("%("), "a %(name)s parameter in a :name file")
            for c in re.finditer(":", chunk):
                name = _IDENT.match(chunk, c.end())
                if name is None or chunk[c.start() - 1 : c.start()] == ":":
                    raise fail(position + c.start(), "a ':' that is no :name parameter")
                params.add(name.group())
            positional = positional or "?" in chunk
        if m is None:
            break
        position = m.end()
    if positional and params:
        raise QueryFileError(source, first, "both ?s and :names: a query takes one or the other")
    return frozenset(params | ({"?"} if positional else set())), frozenset(used)


def load(
    package: str, filename: str, *, style: Style, internal: Iterable[str] = (),
    fields: Iterable[str] = (),
) -> dict[str, Query]:  # fmt: skip
    """The queries of ``<package>/queries/<filename>``, checked (``parse``)."""
    source = f"{package.replace('.', '/')}/queries/{filename}"
    known = STATEMENTS | frozenset(internal)
    return parse(_read(package, filename), source=source, style=style, known=known, fields=fields)


def _read(package: str, filename: str) -> str:
    """``<package>/queries/<filename>``, through the package's own loader (a file, or a member
    of a zip archive), as ``pkgutil.get_data`` does: ``importlib.resources`` would load about
    2 MB of modules (zipfile, tempfile, ...) into every worker for it."""
    module = importlib.import_module(package)
    loader: Any = module.__spec__.loader if module.__spec__ is not None else None
    if module.__file__ is None or not hasattr(loader, "get_data"):
        raise FileNotFoundError(f"{package} has no files to read queries/{filename} from")
    path = os.path.join(os.path.dirname(module.__file__), "queries", filename)
    return bytes(loader.get_data(path)).decode("utf-8")


def texts(queries: Mapping[str, Query]) -> dict[str, str]:
    """Each query's SQL by name: what a statement module exports (``dialect.catalogue`` reads
    a module's names). A query with fields is a template its module formats, left out."""
    return {name: query.sql for name, query in queries.items() if not query.fields}
