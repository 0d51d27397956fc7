"""The dashboard's Webhooks page, on every store backend: each webhook's delivery
record and window, its dead letters, escaped; never its secret; the live fragment; the nav
link."""

from __future__ import annotations

from web_helpers import client, text_of

from workerproc.store import Store
from workerproc.store.webhooks import WEBHOOK_QUEUE, RetryNumbers
from workerproc.window import WINDOW

SECRET = "never-shown-secret"


def test_the_page_shows_each_webhook_and_its_dead_letters(s: Store) -> None:
    hook = s.add_webhook("billing", "https://example.test/<hook>", secret=SECRET,
                         kinds=["run.failed", "run.*"],
                         retry=RetryNumbers(in_flight=3))  # fmt: skip
    lease = s.claim("w", 30.0, queues=[WEBHOOK_QUEUE])
    assert lease is not None
    dead = [{"event": 9, "run_id": 4, "kind": "run.failed", "error": "<b>HTTP 410</b>", "at": 5.0}]
    assert s.move_webhook(lease, 12, delivered=3)  # (each acknowledged POST moves it)
    state = {"cursor": 12, "failures": 2, "last_error": "event 13: HTTP 503", "dead": dead,
             "dead_total": 1}  # fmt: skip
    assert s.compare_and_set(lease, lease.revision, state).value == "ok"
    page = client(s).get("/webhooks")
    assert page.status_code == 200
    html, text = page.text, text_of(page.text)
    assert "failing dead letters window last delivery" in text, "the columns of supervisor webhooks"
    row = "billing https://example.test/&lt;hook&gt; run.failed, run.* running 12 0 3 2 1 3 "
    assert row in text, "its window (POSTs in flight at once) after its dead letters"
    assert "event 13: HTTP 503" in text and "Dead letters of billing (newest 1 of 1)" in text
    assert f'href="/runs/{hook.run_id}"' in html and 'href="/runs/4"' in html
    assert "<b>HTTP 410</b>" not in html and "&lt;b&gt;HTTP 410&lt;/b&gt;" in html
    assert SECRET not in html
    assert '<a href="/webhooks" class="here">Webhooks</a>' in html


def test_the_fragment_and_no_webhook(s: Store) -> None:
    assert "no webhook" in client(s, read_only=True).get("/webhooks").text
    s.add_webhook("h", "https://example.test/", secret=SECRET)
    part = client(s).get("/webhooks", headers={"X-Fragment": "1"}).text
    assert "<html" not in part and 'id="webhook-h"' in part and "pending" in part
    (info,) = s.webhooks()
    row = f"h https://example.test/ all pending {info.cursor} {info.backlog} 0 0 0 {WINDOW} -"
    assert row in text_of(part), "the default window"
