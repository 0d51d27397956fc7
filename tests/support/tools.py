"""External tools a test needs (supervisord, a browser): skip without one, or fail under
LEASEKEEPER_REQUIRE_TOOLS."""

from __future__ import annotations

import os

import pytest


def require_tool(name: str, path: str | None, package: str) -> str:
    if path:
        return path
    why = f"{name} is not installed (apt-get install -y {package}; .ci/run does it)"
    if os.environ.get("LEASEKEEPER_REQUIRE_TOOLS"):
        pytest.fail(why)
    pytest.skip(why)
