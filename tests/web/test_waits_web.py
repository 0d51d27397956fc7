"""The dashboard's side of runs that wait, on every backend: a waiting run's page
says what it waits for and draws a Signal button (with the session's CSRF token) that resumes
it; a parent's page lists its children and a child's page links its parent."""

from __future__ import annotations

from urllib.parse import quote

from web_helpers import client, csrf_of

from workerproc.store import CasResult, Commit, Store
from workerproc.store.codec import WAIT_FOREVER
from workerproc.store.newrun import NewRun

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_the_signal_button_resumes_a_waiting_run(s: Store) -> None:
    run_id = s.start_run("draft")
    lease = s.claim("w", 60)
    assert lease is not None
    wait = Commit(lease, "wait", expected_revision=0, new_state={}, next_task="publish",
                  delay=WAIT_FOREVER, wait_for="signal:approval")  # fmt: skip
    assert s.commit_many([wait]).results == (CasResult.OK,)
    c = client(s)
    html = c.get(f"/runs/{run_id}").text
    assert 'id="waiting-for">signal:approval<' in html and 'id="signal"' in html
    token = csrf_of(html)
    refused = c.post(f"/runs/{run_id}/signal", content="name=approval&csrf=00", headers=FORM)
    assert refused.status_code == 403
    payload = quote('{"ok": true}')
    body = f"csrf={token}&name=approval&payload={payload}"
    done = c.post(f"/runs/{run_id}/signal", content=body, headers=FORM)
    assert done.status_code == 303 and done.headers["location"] == f"/runs/{run_id}?done=signalled"
    assert "signalled" in c.get(done.headers["location"]).text
    resumed = s.claim("w", 60)
    assert resumed is not None and resumed.signal is not None
    assert resumed.signal.payload == {"ok": True}
    assert s.cancel_run(run_id)
    over = c.post(f"/runs/{run_id}/signal", content=body, headers=FORM)
    assert over.status_code == 409 and "cancelled" in over.text


def test_a_parents_page_lists_its_children_and_a_child_links_its_parent(s: Store) -> None:
    parent = s.start_run("fan_out")
    lease = s.claim("w", 60)
    assert lease is not None
    kids = tuple(NewRun.make("kid", i, None, 0, None, "default", 0) for i in range(2))
    spawn = Commit(lease, "spawn", expected_revision=0, new_state={}, next_task="merge",
                   delay=WAIT_FOREVER, children=kids)  # fmt: skip
    assert s.commit_many([spawn]).results == (CasResult.OK,)
    c = client(s)
    html = c.get(f"/runs/{parent}").text
    assert 'id="children"' in html and f'href="/runs/{parent + 1}"' in html
    assert f'href="/runs/{parent + 2}"' in html and "signal:" not in html
    child = c.get(f"/runs/{parent + 1}").text
    assert f'href="/runs/{parent}" id="parent"' in child
    # a child that spawns in turn: the parent's page shows the tree, its grandchild under it
    kid = s.claim("w", 60)
    assert kid is not None and kid.run_id in (parent + 1, parent + 2)
    grand = (NewRun.make("kid", 9, None, 0, None, "default", 0),)
    spawn = Commit(kid, "spawn", expected_revision=0, new_state={}, next_task="merge",
                   delay=WAIT_FOREVER, children=grand)  # fmt: skip
    assert s.commit_many([spawn]).results == (CasResult.OK,)
    tree = c.get(f"/runs/{parent}").text
    nested = tree.split(f'href="/runs/{kid.run_id}"', 1)[1].split("</li>", 1)[0]
    assert f'href="/runs/{parent + 3}"' in nested and "<ul>" in nested
