"""The dashboard against hostile clients: a forged ``Host`` (DNS rebinding), an open
redirect after the token login, ids that only look like digits. In process, through a test
client; the slow-client and deleted-database cases run a real server (test_web_slow_clients.py,
and below)."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

import pytest
from web_helpers import client, csrf_of

from supervisor.web.config import WebConfig
from supervisor.web.security import host_allowed
from workerproc.identity import owner_is_dead, parse_owner
from workerproc.store import Store, open_store

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
TOKEN = "a-token-nobody-guesses-0"


def cancelled_run(s: Store) -> int:
    """A run Retry applies to."""
    run_id = s.start_run("t")
    assert s.cancel_run(run_id)
    return run_id


# -- Host allow-list ---------------------------------------------------------------------------
class TestForgedHost:
    def test_a_page_under_a_foreign_host_is_400_without_cookie_or_csrf_token(
        self, s: Store
    ) -> None:
        run_id = cancelled_run(s)
        c = client(s)
        for url in ("/", f"/runs/{run_id}", "/static/dashboard.js", "/nope"):
            page = c.get(url, headers={"Host": "evil.example"})
            assert page.status_code == 400, url
            assert "set-cookie" not in page.headers
            assert 'name="csrf"' not in page.text
            assert page.headers["x-frame-options"] == "DENY"

    def test_a_rebound_page_cannot_retry_a_run(self, s: Store) -> None:
        """The attack: evil.example re-resolves to 127.0.0.1; its script, same-origin now,
        posts the form with the dashboard's own cookie and CSRF token."""
        run_id = cancelled_run(s)
        c = client(s)
        csrf = csrf_of(c.get(f"/runs/{run_id}").text)  # the session cookie is in the jar now
        forged = c.post(f"/runs/{run_id}/retry", content=f"csrf={csrf}",
                        headers={**FORM, "Host": "evil.example",
                                 "Origin": "http://evil.example"})  # fmt: skip
        assert forged.status_code == 400
        run = s.get_run(run_id)
        assert run is not None and run.status == "cancelled"
        # the same form under the dashboard's own name still works
        done = c.post(f"/runs/{run_id}/retry", content=f"csrf={csrf}", headers=FORM)
        assert done.status_code == 303

    def test_with_a_token_a_foreign_host_is_refused_before_the_login(self, s: Store) -> None:
        page = client(s, token=TOKEN).get(f"/?token={TOKEN}", headers={"Host": "evil.example"})
        assert page.status_code == 400 and "set-cookie" not in page.headers

    def test_allowed_hosts_for_a_proxy(self, s: Store) -> None:
        c = client(s, allowed_hosts=("dash.example.com", ".corp.example"))
        for host in ("dash.example.com", "DASH.example.com:443", "corp.example", "a.b.corp.example",
                     "localhost:8000", "127.0.0.1", "[::1]:8000", "localhost."):  # fmt: skip
            assert c.get("/", headers={"Host": host}).status_code == 200, host
        for host in ("example.com", "dash.example.com.evil.net", "evilcorp.example",
                     "127.0.0.1.nip.io", "localhost:80:80", "localhost:\uff18\uff10".encode(),
                     "[::1]x", "", "dash.example.com@evil.net"):  # fmt: skip
            assert c.get("/", headers={"Host": host}).status_code == 400, host


@pytest.mark.parametrize(
    ("listen", "answered"),
    [("127.0.0.1", True), ("10.1.2.3", True), ("0.0.0.0", False), ("::", False),
     ("fd00::7", True)],
)  # fmt: skip
def test_the_listen_address_itself_is_answered(listen: str, answered: bool) -> None:
    hosts = WebConfig(db="x.db", host=listen).validate().hosts()
    name = f"[{listen}]" if ":" in listen else listen
    assert host_allowed(f"{name}:8000", hosts) is answered
    assert not host_allowed("evil.example", hosts)


# -- the login redirect and ids ----------------------------------------------------------------
class TestRedirectAndIds:
    @pytest.mark.parametrize("path", ["//evil.example/", "///evil.example/x", "/\\evil.example/",
                                      "/\\/evil.example/"])  # fmt: skip
    def test_the_login_redirect_stays_on_the_dashboard(self, s: Store, path: str) -> None:
        c = client(s, token=TOKEN)
        visit = c.get(f"http://localhost{path}?token={TOKEN}&a=1")
        assert visit.status_code == 303
        location = visit.headers["location"]
        assert location.startswith("/") and location[1:2] not in ("/", "\\"), location
        assert location.endswith("evil.example/?a=1") or location.endswith("evil.example/x?a=1")

    @pytest.mark.parametrize("query", ["q=²", "before=²", "after=²", "q=٣", "q=³3", "before=٣",
                                       "q=" + "9" * 5000, "before=" + "1" * 20,
                                       "q=%EF%BC%93"])  # fmt: skip
    def test_an_id_is_ascii_digits_or_a_404(self, s: Store, query: str) -> None:
        for _ in range(4):
            s.start_run("t")
        page = client(s).get(f"/runs?{query}")
        assert page.status_code == 404, (query, page.status_code)
        assert "must be a run id" in page.text

    def test_a_real_id_still_finds_its_run(self, s: Store) -> None:
        run_id = s.start_run("t")
        found = client(s).get(f"/runs?q=%23{run_id}")
        assert found.status_code == 303 and found.headers["location"] == f"/runs/{run_id}"


def test_a_pidfile_that_only_looks_like_a_pid_is_no_supervisor(s: Store, tmp_path: Path) -> None:
    pidfile = tmp_path / "sv.pid"
    pidfile.write_text("²\n")  # str.isdigit() says yes, int() says no
    page = client(s, pidfile=str(pidfile)).get("/")
    assert page.status_code == 200 and "no supervisor is running: no pid in" in page.text


def test_a_lease_owner_that_only_looks_like_a_pid_is_shown_and_judged_alive(s: Store) -> None:
    """Any caller names its lease's owner: ``host:²:start:x`` once made the leases page and a
    run's page a 500, and the supervisor's reaper raise."""
    owner = f"{socket.gethostname()}:²:1.00:x"
    run_id = s.start_run("t")
    assert s.claim(owner, 60) is not None
    c = client(s)
    for url in ("/leases", f"/runs/{run_id}"):
        page = c.get(url)
        assert page.status_code == 200 and ":²:" in page.text, url
    assert parse_owner(owner) is None and not owner_is_dead(owner)


# -- a deleted or replaced database ------------------------------------------------------------
class TestDatabaseGone:
    """An open SQLite connection keeps reading a deleted file: the dashboard showed the old runs
    and Cancel answered 'done=cancelled' on a file that no longer existed."""

    def test_a_deleted_database_is_a_503_page_and_no_action(self, tmp_path: Path) -> None:
        path = str(tmp_path / "lk.db")
        with open_store(path) as store:
            run_id = store.start_run("t")
            c = client(store, db=path)
            csrf = csrf_of(c.get(f"/runs/{run_id}").text)
            for name in (path, path + "-wal", path + "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(name)
            for url in ("/", "/runs", f"/runs/{run_id}", "/leases", "/nope"):
                page = c.get(url)
                assert page.status_code == 503, url
                assert "was deleted while the dashboard was using it" in page.text
            cancel = c.post(f"/runs/{run_id}/cancel", content=f"csrf={csrf}", headers=FORM)
            assert cancel.status_code == 503 and "location" not in cancel.headers
            assert c.get("/static/dashboard.css").status_code == 200
        assert not os.path.exists(path)  # nothing made a new, empty database there

    def test_a_replaced_database_is_never_shown_or_written(self, tmp_path: Path) -> None:
        path, other = str(tmp_path / "lk.db"), str(tmp_path / "other.db")
        with open_store(other) as store:
            store.start_run("someone-elses")
        with open_store(path) as store:
            run_id = store.start_run("t")
            c = client(store, db=path)
            csrf = csrf_of(c.get(f"/runs/{run_id}").text)
            os.replace(other, path)  # a restore, say
            page = c.get("/runs")
            assert page.status_code == 503 and "was replaced by another file" in page.text
            assert "someone-elses" not in page.text
            cancel = c.post(f"/runs/{run_id}/cancel", content=f"csrf={csrf}", headers=FORM)
            assert cancel.status_code == 503
            run = store.get_run(run_id)  # this connection still reads the file it opened
            assert run is not None and run.task == "t" and run.status == "pending"
