"""The dashboard's pages and actions through a test client, on every store backend, with a fake
clock: what each page shows, the live fragments, keyset pages, the run timeline, retry and
cancel with their CSRF token, ``--read-only``, 404 pages for bad ids and paths, and reads that
never need the write lock."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import FakeClock
from store_backends import Backend, advance, claim, commit, finish
from web_helpers import client, csrf_of, text_of

from supervisor.chaos.verifier import FaultEvent, Verifier
from workerproc.store import Commit, Stats, Store, WorkerInfo


def test_overview_shows_the_queue_runs_by_status_and_the_last_hour(
    s: Store, clock: FakeClock
) -> None:
    done = s.start_run("t", state={})
    s.start_run("t")
    s.start_run("later", delay=60)
    lease = claim(s, "host:42:1.0:abcd")
    assert lease.run_id == done and finish(s, lease, 0, {"ok": True}).value == "ok"
    claim(s, "host:43:1.0:ef01")
    page = client(s).get("/")
    assert page.status_code == 200
    html = page.text
    assert 'id="queue-delayed">1<' in html and 'id="queue-leased">1<' in html
    assert 'id="runs-succeeded">1<' in html and 'id="runs-running">1<' in html
    assert "last hour: 1 succeeded" in html
    assert html.count('<rect class="ok"') == 1  # the one finished run, drawn
    assert "Workers" not in html  # no --pidfile


def test_overview_lists_every_hosts_worker_processes_from_the_database(
    s: Store, clock: FakeClock
) -> None:
    """No pidfile needed (another host's pool shows as well as this one's)."""
    html = client(s).get("/").text
    assert "No worker process is listed in the database" in html
    s.worker_seen(WorkerInfo("db7:41:1.0:aa", "db7", 41, 1.0, 2.0, 16, ("llm",), "9.9"),
                  starting=True)  # fmt: skip
    s.worker_seen(WorkerInfo("web3:42:1.0:bb", "web3", 42, 1.0, 20.0, 4, None, "9.9"))
    clock.advance(7)  # db7 missed three beats; web3 did not
    text = text_of(client(s).get("/").text)
    assert "1 alive on 1 host(s), 4 slots" in text
    assert "db7 41 silent 16 llm 9.9" in text and "web3 42 running 4 (all) 9.9" in text


def test_a_fragment_is_the_live_part_only(s: Store) -> None:
    s.start_run("t")
    full = client(s).get("/runs").text
    part = client(s).get("/runs", headers={"X-Fragment": "1"}).text
    assert "<html" in full and "data-poll" in full and "/static/dashboard.js" in full
    assert "<html" not in part and "<table" in part and "filter" not in part


def test_overview_lists_the_supervisors_workers_from_its_pidfile(s: Store, tmp_path: Path) -> None:
    owner = f"host:{os.getpid()}:1.0:beef"
    run_id = s.start_run("t")
    claim(s, owner)
    pidfile = tmp_path / "sv.pid"
    pidfile.write_text(f"{os.getpid()}\n")  # a live pid that started before the file
    state = {"pid": os.getpid(), "phase": "running", "target": 2, "generation": 1, "tick": 0,
             "concurrency": 4,
             "workers": [{"pid": os.getpid(), "index": 0, "owner": owner, "phase": "handler",
                          "busy": 3},
                         {"pid": 1, "index": 1, "owner": "x", "phase": "idle"}]}  # fmt: skip
    (tmp_path / "sv.pid.state").write_text(json.dumps(state))
    html = client(s, pidfile=str(pidfile)).get("/").text
    assert "workers (target 2)" in text_of(html)
    assert f'<a href="/runs/{run_id}">{run_id}</a>' in html  # the lease it holds
    assert 'class="phase handler"' in html and 'class="phase idle"' in html
    assert "<td>3/4</td><td>1</td>" in html and "<td>0/4</td><td>0</td>" in html  # busy, leases
    pidfile.write_text("999999999\n")  # nobody: the page says so instead of listing ghosts
    html = client(s, pidfile=str(pidfile)).get("/").text
    assert "no supervisor is running" in html and 'class="phase' not in html


class TestRuns:
    def test_filters_keyset_pages_and_search(self, s: Store) -> None:
        made = [s.start_run("alpha" if i % 2 else "beta") for i in range(120)]
        c = client(s)
        first = c.get("/runs").text
        assert f'href="/runs/{made[-1]}"' in first and f'href="/runs/{made[-50]}"' in first
        assert f'href="/runs/{made[-51]}"' not in first
        assert f'before={made[-50]}"' in first and "newer" not in first
        second = c.get(f"/runs?before={made[-50]}").text
        assert f'href="/runs/{made[-51]}"' in second and f"after={made[-51]}" in second
        back = c.get(f"/runs?after={made[-51]}").text
        assert f'href="/runs/{made[-1]}"' in back and f'href="/runs/{made[-51]}"' not in back
        alpha = c.get("/runs?task=alpha", headers={"X-Fragment": "1"}).text
        assert text_of(alpha).count(" alpha ") == 50 and " beta " not in text_of(alpha)
        assert "before=" in alpha and "task=alpha&amp;before=" in alpha
        assert c.get("/runs?status=failed").text.count("<tr>") == 0
        found = c.get(f"/runs?q=%23{made[3]}")
        assert found.status_code == 303 and found.headers["location"] == f"/runs/{made[3]}"

    @pytest.mark.parametrize(
        "url",
        ["/runs?status=exploded", "/runs?before=abc", "/runs?after=-1", "/runs?q=99999",
         "/runs?q=abc", f"/runs?before={2**70}", "/runs/424242", f"/runs/{2**70}",
         "/runs/abc", "/nope", "/static/../app.py", "/runs?before=1&after=2"],
    )  # fmt: skip
    def test_bad_ids_and_paths_get_a_404_page(self, s: Store, url: str) -> None:
        page = client(s).get(url)
        assert page.status_code == 404, page.text
        assert "<h1>404</h1>" in page.text and "Traceback" not in page.text


class TestRunPage:
    def test_the_timeline_shows_every_attempt_and_how_it_ended(
        self, s: Store, clock: FakeClock
    ) -> None:
        run_id = s.start_run("prepare", state={})
        first = claim(s, "host:101:1.0:aaaa", 10)
        clock.advance(1)
        assert s.release(first, error="ValueError: boom")
        zombie = claim(s, "host:102:1.0:bbbb", 10)
        clock.advance(11)  # its lease runs out: taken over
        third = claim(s, "host:103:1.0:cccc", 30)
        assert s.compare_and_set(zombie, 0, {"late": 1}).value == "lease_lost"
        clock.advance(2)
        assert advance(s, third, 0, {"n": 1}, "call").value == "ok"
        claim(s, "host:104:1.0:dddd", 30)  # the second task, held now
        html = client(s).get(f"/runs/{run_id}").text
        text = text_of(html)
        rows = (
            "1 pid 101 (aaaa) +0 ms 1.00 s released ValueError: boom",
            "2 pid 102 (bbbb) +1.00 s 10.00 s taken over by pid 103 (cccc) after 1.00 s"
            " compare_and_set at +12.00 s",
            "3 pid 103 (cccc) +12.00 s 2.00 s committed",
            "call 1 pid 104 (dddd) +14.00 s 0 ms holding the lease in 30.00 s",
        )
        for row in rows:
            assert row in text, row
        assert html.count('<line class="refused"') == 1  # the zombie's refused write
        assert '<rect class="taken_over"' in html and '<rect class="holding"' in html
        assert 'id="cancel"' in html and 'id="retry"' not in html

    def test_state_result_and_failure_are_shown(self, s: Store) -> None:
        run_id = s.start_run("t", state={"tokens": 12})
        lease = claim(s)
        commit(s, Commit(lease, "fail", reason="gave_up", error="RuntimeError: <b>no</b>"))
        html = client(s).get(f"/runs/{run_id}").text
        assert "&#34;tokens&#34;: 12" in html or '"tokens": 12' in html
        assert "gave_up" in html and "&lt;b&gt;no&lt;/b&gt;" in html  # escaped, never markup
        assert 'id="retry"' in html


class TestActions:
    def test_retry_and_cancel_need_the_csrf_token_of_the_session(self, s: Store) -> None:
        run_id = s.start_run("t")
        c = client(s)
        token = csrf_of(c.get(f"/runs/{run_id}").text)
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        for body in ("", "csrf=0000", f"csrf={token}x"):
            refused = c.post(f"/runs/{run_id}/cancel", content=body, headers=form)
            assert refused.status_code == 403 and "stale" in refused.text
        other = client(s)  # another browser: another session, another token
        other.get("/")
        stolen = other.post(f"/runs/{run_id}/cancel", content=f"csrf={token}", headers=form)
        assert stolen.status_code == 403
        cross = c.post(f"/runs/{run_id}/cancel", content=f"csrf={token}",
                       headers={**form, "Origin": "http://evil.example"})  # fmt: skip
        assert cross.status_code == 403
        run = s.get_run(run_id)
        assert run is not None and run.status == "pending"
        done = c.post(f"/runs/{run_id}/cancel", content=f"csrf={token}", headers=form)
        assert done.status_code == 303
        assert done.headers["location"] == f"/runs/{run_id}?done=cancelled"
        assert "cancelled" in c.get(done.headers["location"]).text
        again = c.post(f"/runs/{run_id}/cancel", content=f"csrf={token}", headers=form)
        assert again.status_code == 409 and "already cancelled" in again.text
        retried = c.post(f"/runs/{run_id}/retry", content=f"csrf={token}", headers=form)
        assert retried.status_code == 303
        run = s.get_run(run_id)
        assert run is not None and run.status == "pending"
        gone = c.post("/runs/424242/retry", content=f"csrf={token}", headers=form)
        assert gone.status_code == 404
        assert c.post(f"/runs/{run_id}/retry", content=f"csrf={token}").status_code == 415
        huge = c.post(f"/runs/{run_id}/retry", content="csrf=" + "0" * 100_000, headers=form)
        assert huge.status_code == 413

    def test_read_only_serves_no_action_and_draws_no_form(self, s: Store) -> None:
        run_id = s.start_run("t")
        c = client(s, read_only=True)
        html = c.get(f"/runs/{run_id}").text
        assert '<form method="post"' not in html and "read-only" in html
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        for action in ("retry", "cancel"):
            page = c.post(f"/runs/{run_id}/{action}", content="csrf=x", headers=form)
            assert page.status_code in (404, 405)
        run = s.get_run(run_id)
        assert run is not None and run.status == "pending"


class TestToken:
    def test_every_request_needs_the_token(self, s: Store) -> None:
        c = client(s, token="s3cret-token-0123456")
        for url in ("/", "/runs", "/static/dashboard.js", "/nope"):
            assert c.get(url).status_code == 401
        assert c.get("/?token=wrong-token").status_code == 401
        assert (
            c.get("/", headers={"Authorization": "Bearer s3cret-token-0123456"}).status_code == 200
        )
        visit = c.get("/runs?status=failed&token=s3cret-token-0123456")
        assert visit.status_code == 303 and visit.headers["location"] == "/runs?status=failed"
        assert "s3cret-token-0123456" not in visit.headers["set-cookie"]  # a MAC of it, HttpOnly
        assert "HttpOnly" in visit.headers["set-cookie"]
        assert c.get("/runs?status=failed").status_code == 200  # the cookie from now on
        assert (
            client(s, token="s3cret-token-0123456").get("/runs").status_code == 401
        )  # not elsewhere


def test_security_headers_on_every_page(s: Store) -> None:
    for url in ("/", "/nope"):
        headers = client(s).get(url).headers
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and headers["cache-control"] == "no-store"


def test_leases_tick_down_from_the_time_left(s: Store, clock: FakeClock) -> None:
    s.start_run("t")
    claim(s, "host:77:1.0:feed", 30)
    clock.advance(12.5)
    html = client(s).get("/leases").text
    assert "pid 77 (feed)" in html and 'data-left="17.500"' in html


class TestChaosPage:
    def test_without_a_report_it_says_how_to_get_one(self, s: Store, tmp_path: Path) -> None:
        assert "--chaos-report FILE" in client(s).get("/chaos").text
        missing = client(s, chaos_report=str(tmp_path / "none.json")).get("/chaos").text
        assert "no report yet" in missing
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        page = client(s, chaos_report=str(bad)).get("/chaos")
        assert page.status_code == 200 and "not valid JSON" in page.text

    def test_a_report_is_drawn(self, s: Store, tmp_path: Path) -> None:
        verifier = Verifier(ttl=1.0, poll_interval=0.2, fast_release=True)
        for k, (fault, outcome, ms) in enumerate([("kill", "taken_over", 8.0),
                                                  ("pause", "taken_over", 1800.0),
                                                  ("kill", "no_lease", None)]):  # fmt: skip
            task = None if outcome == "no_lease" else 10 + k
            verifier.record(FaultEvent(fault, 100 + k, task, 1, 1000.0 + k, "handler",
                                       2.0, outcome=outcome, taken_over_ms=ms))  # fmt: skip
        verifier.events[1].claimable_ms = 3500.0  # a slow takeover: a warning, not a verdict
        verifier.violations.append("task 9 attempt 2 committed 1.00 s after the fault")
        path = tmp_path / "chaos.json"
        path.write_text(json.dumps(verifier.report(seed=7, duration_s=3.0)))
        html = client(s, chaos_report=str(path)).get("/chaos").text
        assert 'id="verdict">VIOLATIONS<' in html and "committed 1.00 s after" in html
        assert "task 11 taken over after 1800 ms, 3500 ms of it claimable" in html
        assert html.count('<rect class="span"') == 2  # two takeovers, drawn with their latency
        assert html.count('<rect class="muted"') == 1  # the fault that orphaned nothing
        assert "2 takeovers (ms)" in html and "seed 7" in html


def test_the_chaos_page_follows_the_report_file(s: Store, tmp_path: Path) -> None:
    path = tmp_path / "chaos.json"
    c = client(s, chaos_report=str(path))
    assert "no report yet" in c.get("/chaos").text
    path.write_text(json.dumps({"ok": True, "violations": [], "events": [], "seed": 1}))
    assert "seed 1" in c.get("/chaos").text
    path.write_text(json.dumps({"ok": True, "violations": [], "events": [], "seed": 22}))
    assert "seed 22" in c.get("/chaos").text  # parsed again: the file changed


def test_reads_never_need_the_write_lock(backend: Backend, clock: FakeClock) -> None:
    """Every page renders while another connection holds the write lock; a read that needed it
    would wait out the busy timeout and answer 503."""
    store = backend.open(clock)
    run_id = store.start_run("t", state={})
    claim(store, "host:5:1.0:aa")
    c = client(store)
    with backend.hold_write_lock():
        for url in ("/", "/runs", f"/runs/{run_id}", "/leases", "/chaos", "/runs?task=t"):
            assert c.get(url).status_code == 200, url
    store.close()


def test_an_unexpected_failure_is_a_500_page_without_a_traceback(
    s: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom() -> Stats:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(s, "stats", boom)
    page = client(s).get("/leases")
    assert page.status_code == 500
    assert "Traceback" not in page.text and "secret internals" not in page.text
