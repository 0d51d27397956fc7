"""Every code block of README.md and of the docs site that is meant to be run runs, exactly as
written, with only the set-up its page shows (tests/support/docs_blocks.py says how blocks are
marked). A page whose blocks read ``DATABASE_URL`` gets a PostgreSQL database of its own."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pg_session
import psutil
import pytest
from docs_blocks import (
    ROOT,
    PageFailed,
    blocks,
    clean_env,
    documentation,
    problems,
    run_page,
    runnable,
)
from helpers import wait_for

pytestmark = pytest.mark.slow

RUNNABLE = [page for page in documentation() if runnable(page)]


def test_every_code_block_says_whether_it_is_run() -> None:
    found = [problem for page in documentation() for problem in problems(page)]
    assert not found, "\n".join(found)
    kinds = [b.kind for page in documentation() for b in blocks(page)]
    # the markers really matched: a changed notation must not silently run nothing
    assert kinds.count("run") >= 25 and kinds.count("file") >= 10 and kinds.count("output") >= 8
    assert {p.relative_to(ROOT).as_posix() for p in RUNNABLE} >= {
        "README.md",
        "docs/tutorial.md",
        "docs/how-to/start-runs.md",
        "docs/how-to/transactional-enqueue.md",
    }


@pytest.fixture
def page_database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """A database of the page's own on the test server, when its blocks read DATABASE_URL."""
    page: Path = request.param
    if not any("DATABASE_URL" in b.body for b in blocks(page) if b.kind in ("run", "file")):
        yield None
        return
    import psycopg  # noqa: PLC0415 - only these pages need the driver

    pg_session.database_url()  # skips (or, in CI, fails) loudly without a server
    name = f"lk_docs_{secrets.token_hex(4)}"
    with psycopg.connect(pg_session.ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(pg_session.ADMIN_URL)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(pg_session.ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize(
    "page_database", RUNNABLE, ids=[p.relative_to(ROOT).as_posix() for p in RUNNABLE],
    indirect=True,
)  # fmt: skip
def test_the_page_runs_as_written(page_database: str | None, request: pytest.FixtureRequest,
                                  tmp_path: Path) -> None:  # fmt: skip
    page = request.node.callspec.params["page_database"]
    extra = {"DATABASE_URL": page_database} if page_database else {}
    try:
        ran = run_page(page, tmp_path, clean_env(extra))
    except PageFailed as exc:
        pytest.fail(str(exc), pytrace=False)
    assert ran == sum(b.kind == "run" for b in blocks(page))


def write(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_failing_block_a_wrong_output_and_a_missing_marker_fail_the_page(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    good = write(
        tmp_path, "<!-- run -->\n```sh\necho hello\n```\n\n<!-- output -->\n```text\nhello\n```\n"
    )
    assert run_page(good, work, clean_env()) == 1
    failing = write(tmp_path, "<!-- run -->\n```sh\necho hello\nfalse\necho never\n```\n")
    with pytest.raises(PageFailed, match="exit code 1"):
        run_page(failing, work, clean_env())
    wrong = write(
        tmp_path, "<!-- run -->\n```sh\necho hello\n```\n<!-- output -->\n```text\nbye\n```\n"
    )
    with pytest.raises(PageFailed, match="'bye' is not in the output"):
        run_page(wrong, work, clean_env())
    unmarked = write(tmp_path, "Text.\n\n```sh\nrm -rf /tmp/nothing\n```\n")
    with pytest.raises(PageFailed, match="without a marker"):
        run_page(unmarked, work, clean_env())
    no_reason = write(tmp_path, "<!-- not run: x -->\n```sh\nls\n```\n")
    assert problems(no_reason) and "must say why" in problems(no_reason)[0]


def test_a_page_keeps_its_files_and_its_background_processes_end_with_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    page = write(
        tmp_path,
        "<!-- file: hello.py -->\n```python\nprint('from a file the page wrote')\n```\n\n"
        "<!-- run -->\n```sh\nsleep 300 &\necho $! > sleeper.pid\npython hello.py\n```\n\n"
        "<!-- output -->\n```text\nfrom a file the page wrote\n```\n",
    )
    assert run_page(page, work, clean_env()) == 1
    pid = int((work / "sleeper.pid").read_text())
    wait_for(lambda: gone(pid), timeout=10, what="the page's background process killed")


def gone(pid: int) -> bool:
    """Killed: no such process, or a zombie waiting for init to reap it."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
