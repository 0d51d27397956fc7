"""The dashboard's Fork form (B24), on every backend: each step of a run's page has one, behind
the session's CSRF token as every action is; posting it starts the new run and opens its page
(which says where it was forked from), with the step's state or the one typed in; a bad step
or state is refused with nothing written; ``--read-only`` draws no form and serves no route."""

from __future__ import annotations

import html as markup
from urllib.parse import quote

from helpers import failed_at_step_two
from web_helpers import client, csrf_of, text_of

from workerproc.store import Store

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_the_fork_form_starts_a_run_from_its_step(s: Store) -> None:
    source = failed_at_step_two(s)
    c = client(s)
    html = c.get(f"/runs/{source}").text
    assert 'id="fork-1"' in html and 'id="fork-2"' in html and 'id="fork-3"' not in html
    assert "Fork from this step" in html
    token = csrf_of(html)
    for body in ("step=2", "step=2&csrf=00", f"step=2&csrf={token}x"):
        refused = c.post(f"/runs/{source}/fork", content=body, headers=FORM)
        assert refused.status_code == 403 and "stale" in refused.text
    cross = c.post(f"/runs/{source}/fork", content=f"csrf={token}&step=2",
                   headers={**FORM, "Origin": "http://evil.example"})  # fmt: skip
    assert cross.status_code == 403
    assert [r.id for r in s.list_runs()] == [source]  # nothing started by a refused form
    done = c.post(f"/runs/{source}/fork", content=f"csrf={token}&step=2&state=", headers=FORM)
    assert done.status_code == 303
    new = int(done.headers["location"].split("/runs/", 1)[1].split("?")[0])
    assert done.headers["location"] == f"/runs/{new}?done=forked" and new != source
    run = s.get_run(new)
    assert run is not None and (run.status, run.task, run.state) == ("pending", "b", {"n": 1})
    page = c.get(done.headers["location"]).text
    assert "started: a fork" in page
    assert f'<a href="/runs/{source}" id="forked-from">run {source}</a>, step 2' in page
    state = quote('{"fixed": true}')
    given = c.post(f"/runs/{source}/fork", content=f"csrf={token}&step=1&state={state}",
                   headers=FORM)  # fmt: skip
    assert given.status_code == 303
    other = s.get_run(int(given.headers["location"].split("/runs/", 1)[1].split("?")[0]))
    assert other is not None and (other.task, other.state) == ("a", {"fixed": True})
    was = s.get_run(source)
    assert was is not None and was.status == "failed"


def test_a_bad_step_or_state_is_refused_and_nothing_is_written(s: Store) -> None:
    source = failed_at_step_two(s)
    c = client(s)
    token = csrf_of(c.get(f"/runs/{source}").text)
    cases = {"step=3": "never entered step 3", "step=0": "a fork's step",
             "step=x": "a fork's step", "": "a fork's step",
             "step=1&state=" + quote("{nope"): "the state",
             "step=1&state=null": "leave it empty"}  # fmt: skip
    for body, says in cases.items():
        page = c.post(f"/runs/{source}/fork", content=f"csrf={token}&{body}", headers=FORM)
        assert page.status_code == 409 and says in markup.unescape(text_of(page.text)), body
    gone = c.post("/runs/424242/fork", content=f"csrf={token}&step=1", headers=FORM)
    assert gone.status_code == 404
    assert [r.id for r in s.list_runs()] == [source]


def test_read_only_draws_no_fork_form_and_serves_no_fork(s: Store) -> None:
    source = failed_at_step_two(s)
    c = client(s, read_only=True)
    html = c.get(f"/runs/{source}").text
    assert "Fork from this step" not in html and 'id="steps"' in html  # the steps, no form
    page = c.post(f"/runs/{source}/fork", content="csrf=x&step=1", headers=FORM)
    assert page.status_code in (404, 405)
    assert [r.id for r in s.list_runs()] == [source]


def test_the_steps_say_each_tasks_version(s: Store) -> None:
    versioned = s.start_run("t", version=3)
    plain = s.start_run("t")
    c = client(s)
    steps = [text_of(c.get(f"/runs/{run}").text.split('id="steps"')[1].split("</table>")[0])
             for run in (versioned, plain)]  # fmt: skip
    assert "version" in steps[0] and " 3 " in f" {steps[0]} "
    assert "-" in steps[1] and " 3 " not in f" {steps[1]} "
