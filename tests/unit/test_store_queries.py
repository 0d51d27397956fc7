"""The store's SQL as named queries (``workerproc/store/queries.py``): a ``.sql`` file is read
and checked when its module is imported, and every mistake in it is an error that names the
file and the line."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from workerproc.store import queries
from workerproc.store.queries import QueryFileError, parse
from workerproc.store.types import SYSTEM_RUNS

KNOWN = {"GET_RUN", "LIST_RUNS", "RUN_STATUS", "WATCH_RUN"}

GOOD = """-- The reads of a test backend.
--
-- (the file's own opening comment)

-- name: GET_RUN
-- One run by its id,
-- described on two lines.
SELECT id, 'signal:' || name, ':not_a_param'
    FROM runs WHERE id = :run_id

-- name: LIST_RUNS
-- Runs, newest first.
SELECT id FROM runs WHERE (:status IS NULL OR status = :status)
    ORDER BY id DESC LIMIT :limit


-- name: RUN_STATUS
-- Positional parameters (the hot path's cheaper binding).
INSERT INTO events (at, kind) VALUES (?, ?)
"""


def named(text: str, **kwargs: object) -> dict[str, queries.Query]:
    return parse(text, source="x.sql", style="named", known=KNOWN, **kwargs)  # type: ignore[arg-type]


def pyformat(text: str, **kwargs: object) -> dict[str, queries.Query]:
    return parse(text, source="x.sql", style="pyformat", known=KNOWN, **kwargs)  # type: ignore[arg-type]


def fails(text: str, line: int, message: str, style: str = "named", **kwargs: object) -> None:
    with pytest.raises(QueryFileError) as caught:
        parse(text, source="pkg/queries/x.sql", style=style, known=KNOWN, **kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(f"pkg/queries/x.sql:{line}: "), str(caught.value)
    assert re.search(message, str(caught.value)), str(caught.value)
    assert caught.value.line == line


def test_a_file_of_blocks_gives_each_query_its_description_sql_and_parameters() -> None:
    found = named(GOOD)
    assert list(found) == ["GET_RUN", "LIST_RUNS", "RUN_STATUS"]
    get = found["GET_RUN"]
    assert get.description == "One run by its id, described on two lines."
    assert (
        get.sql == "SELECT id, 'signal:' || name, ':not_a_param'\n    FROM runs WHERE id = :run_id"
    )
    assert get.params == {"run_id"}  # colons inside a string are no parameters
    assert get.line == 5
    assert found["LIST_RUNS"].params == {"status", "limit"}
    assert found["LIST_RUNS"].sql.endswith("LIMIT :limit")  # trailing blank lines dropped
    assert found["RUN_STATUS"].params == {"?"}


def test_pyformat_parameters_casts_and_escaped_percents() -> None:
    text = """-- name: LIST_RUNS
-- Runs of a status, if one is given.
SELECT id, '100%' FROM runs WHERE (%(status)s::text IS NULL OR status = %(status)s)
    AND name LIKE 'a%%' AND id < %(before)s
"""
    found = pyformat(text)["LIST_RUNS"]
    assert found.params == {"status", "before"}


def test_fields_are_allowed_only_where_the_loader_says() -> None:
    text = "-- name: LIST_RUNS\n-- With a schema prefix.\nSELECT id FROM {s}runs\n"
    assert pyformat(text, fields=("s",))["LIST_RUNS"].fields == {"s"}
    fails(text, 3, "brace that is no field", style="pyformat")
    fails(text.replace("{s}", "{t}"), 3, "brace that is no field", style="pyformat", fields=("s",))
    fails(text.replace("{s}", "{ "), 3, "brace", style="pyformat", fields=("s",))
    # a brace inside a string literal is the string's
    assert named(text.replace("{s}runs", "runs WHERE data = '{}'"))["LIST_RUNS"].fields == set()


def test_a_name_given_twice_is_refused_with_both_lines() -> None:
    text = "-- name: GET_RUN\n-- One.\nSELECT 1\n\n-- name: GET_RUN\n-- Two.\nSELECT 2\n"
    fails(text, 5, r"GET_RUN is named twice \(line 1\)")


def test_a_query_without_description_is_refused() -> None:
    fails("-- name: GET_RUN\nSELECT 1\n", 1, "GET_RUN has no description")
    fails("-- name: GET_RUN\n--\nSELECT 1\n", 1, "GET_RUN has no description")


def test_a_query_without_sql_is_refused() -> None:
    fails("-- name: GET_RUN\n-- Nothing follows.\n\n", 1, "GET_RUN has no SQL")
    text = "-- name: GET_RUN\n-- Nothing.\n-- name: LIST_RUNS\n-- Runs.\nSELECT 1\n"
    fails(text, 1, "GET_RUN has no SQL")


def test_a_name_the_store_does_not_know_is_refused() -> None:
    fails("-- name: NO_SUCH\n-- What?\nSELECT 1\n", 1, "NO_SUCH is not a statement we know")
    fails("-- name: get_run\n-- Lower case.\nSELECT 1\n", 1, "is not a query name")
    fails("-- name:\n-- Empty.\nSELECT 1\n", 1, "is not a query name")


def test_the_real_statement_names_are_known_by_default() -> None:
    found = parse("-- name: CLAIM_RUNS\n-- A claim.\nSELECT 1\n", source="x", style="named")
    assert list(found) == ["CLAIM_RUNS"]


def test_sql_before_the_first_block_is_refused() -> None:
    fails("-- a comment\nSELECT 1\n-- name: GET_RUN\n-- One.\nSELECT 1\n", 2, "SQL before")


def test_a_comment_inside_a_querys_sql_is_refused() -> None:
    text = "-- name: GET_RUN\n-- One.\nSELECT 1\n-- an afterthought\nFROM runs\n"
    fails(text, 4, "a comment inside query GET_RUN")


def test_a_parameter_of_the_wrong_style_is_refused_at_its_line() -> None:
    text = "-- name: GET_RUN\n-- One.\nSELECT id\n    FROM runs WHERE id = {p}\n"
    fails(text.format(p="%(run_id)s"), 4, r"%\(name\)s parameter in a :name file")
    fails(text.format(p=":run_id"), 4, r":name parameter in a %\(name\)s file", style="pyformat")


def test_a_malformed_parameter_is_refused() -> None:
    text = "-- name: GET_RUN\n-- One.\nSELECT id FROM runs WHERE id = {p}\n"
    fails(text.format(p="%(run_id)d"), 3, "'%' that is no", style="pyformat")
    fails(text.format(p="% 2"), 3, "'%' that is no", style="pyformat")
    fails(text.format(p=": run_id"), 3, "':' that is no :name")
    fails(text.format(p="x::int"), 3, "':' that is no :name")  # no casts on SQLite
    fails(text.format(p=":a OR id = ?"), 3, "both")


def test_every_query_file_of_both_backends_loads() -> None:
    from workerproc.store.postgres import steps as postgres_steps  # noqa: PLC0415
    from workerproc.store.sqlite import steps as sqlite_steps  # noqa: PLC0415

    for backend, steps in (("sqlite", sqlite_steps), ("postgres", postgres_steps)):
        folder = resources.files(f"workerproc.store.{backend}").joinpath("queries")
        files = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
        assert len(files) >= 7, (backend, files)
        assert steps.CATALOGUE  # built from them at import


def test_the_constants_written_out_in_queries_are_the_codes() -> None:
    """A query's text names the system's runs by their first id (``SYSTEM_RUNS``), written
    out: it must be the code's."""
    from workerproc.store.postgres import ops_sql as postgres_ops  # noqa: PLC0415
    from workerproc.store.postgres import webhooks_sql as postgres_webhooks  # noqa: PLC0415
    from workerproc.store.sqlite import ops_sql as sqlite_ops  # noqa: PLC0415
    from workerproc.store.sqlite import sql as sqlite_sql  # noqa: PLC0415
    from workerproc.store.sqlite import webhooks_sql as sqlite_webhooks  # noqa: PLC0415

    found = 0
    for module in (sqlite_ops, sqlite_webhooks, sqlite_sql, postgres_ops, postgres_webhooks):
        for query in module.QUERIES.values():
            for number in re.findall(r"\b\d{10,}\b", query.sql):
                assert number == str(SYSTEM_RUNS), (query.name, number)
                found += 1
    assert found >= 6
