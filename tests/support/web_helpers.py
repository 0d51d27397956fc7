"""Shared by the dashboard tests: an app on a store with a fake clock, and a client."""

from __future__ import annotations

import re
from typing import Any

from starlette.testclient import TestClient

from supervisor.web.app import create_app
from supervisor.web.config import WebConfig
from workerproc.store import Store


def client(store: Store, db: str = "test.db", **options: Any) -> TestClient:
    config = WebConfig(db=db, **options).validate()
    return TestClient(
        create_app(config, store),
        base_url="http://localhost",  # a name the dashboard answers (not "testserver")
        raise_server_exceptions=False,
        follow_redirects=False,
    )


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def text_of(html: str) -> str:
    """The page's visible text, roughly: tags out, whitespace collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())
