"""docs/how-to/batch-apis.md in its acceptance form: 1,000 items through the provider's batch API
pattern, the fake provider answering after a full minute, a worker killed while the items wait:
the page's own check says every item resumed with its own result and was billed once. (The
docs suite runs the same page with its default few seconds, tests/docs/test_docs_examples.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_blocks import ROOT, PageFailed, blocks, clean_env, run_page

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

PAGE = ROOT / "docs" / "how-to" / "batch-apis.md"


def test_a_thousand_items_wait_a_minute_for_the_provider_through_a_worker_kill(
    tmp_path: Path,
) -> None:
    env = clean_env({"PROVIDER_DELAY": "60", "ITEMS": "1000", "PYTHONPATH": str(ROOT)})
    try:
        ran = run_page(PAGE, tmp_path, env)
    except PageFailed as exc:
        pytest.fail(str(exc), pytrace=False)
    assert ran == sum(b.kind == "run" for b in blocks(PAGE))
    billed = (tmp_path / "bill.jsonl").read_text().splitlines()
    assert 1 <= len(billed) <= 4  # 1,000 items in a few submissions of up to 500
