"""The dashboard's Limits page, on every store backend: each limit's numbers, its use
now, the runs waiting behind it and its busiest keys, escaped; the live fragment; the nav link;
the page under ``--read-only``."""

from __future__ import annotations

from store_backends import claim
from web_helpers import client, text_of

from workerproc.store import Store, TaskOptions
from workerproc.store.limits import LimitSpec


def gated(s: Store) -> None:
    s.register_tasks({"call": TaskOptions(limits=("openai", "per-tenant"), tokens=100)})
    s.declare_limits({
        "openai": LimitSpec.declare("openai", rate="60/h", burst=5, concurrency=1,
                                    tokens="600/h", token_burst=6000),
        "per-tenant": LimitSpec.declare("per-tenant", concurrency=3, per="tenant"),
    }, by="host-a")  # fmt: skip
    tenants = ["<script>alert(1)</script>", "<script>alert(1)</script>", "b&b"]
    s.start_runs([{"task": "call", "payload": {"tenant": t}} for t in tenants])


def test_the_page_shows_each_limit_its_use_waiting_and_busiest_keys(s: Store) -> None:
    gated(s)
    claim(s, "host:42:1.0:abcd")  # openai's one slot: the two others wait behind it
    page = client(s).get("/limits")
    assert page.status_code == 200
    html = page.text
    text = text_of(html)
    assert "openai - 1/m 5 1 10/m 1 2 4 5900 0 declared by host-a" in text
    assert "per-tenant tenant - - 3 - 1 2 - - 0 declared by host-a" in text
    assert "Busiest keys of per-tenant" in text
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "b&amp;b" in html
    assert '<a href="/limits" class="here">Limits</a>' in html


def test_the_fragment_is_the_table_only_and_follows_limits_set(s: Store) -> None:
    gated(s)
    s.set_limit("openai", concurrency=2)
    part = client(s).get("/limits", headers={"X-Fragment": "1"}).text
    assert "<html" not in part and "<table" in part
    assert "set by an operator" in part
    assert "limits" in client(s).get("/").text.lower()  # the nav links it from every page


def test_no_limit_and_read_only(s: Store) -> None:
    html = client(s, read_only=True).get("/limits").text
    assert "no limit is declared" in html and '<form method="post"' not in html
    gated(s)
    ro = client(s, read_only=True).get("/limits")
    assert ro.status_code == 200 and 'id="limit-openai"' in ro.text
    assert client(s, read_only=True).post("/limits").status_code in (404, 405)
