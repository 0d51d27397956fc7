"""A host cut off from its database and healed (tests/support/partition.py): three hosts as network
namespaces, each with its own supervisor, one private PostgreSQL; host 1 loses the database for 1
s, then for 10 s, while runs flow. The ledger and the database must show: at most one handler of
a task on a live lease, no zombie write accepted, every run succeeded, and host 1's workers
claiming again soon after each heal. ``scripts/soak --pressure`` runs the full form (1, 10 and 60
s). Needs root, iproute2 and nftables (.ci/run installs them)."""

from __future__ import annotations

from pathlib import Path

import netns
import partition
import pg_private
import pytest
from tools import require_tool

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]


def test_a_host_cut_off_for_1_and_10_seconds_loses_nothing_and_resumes(tmp_path: Path):
    why = netns.missing() or pg_private.missing()
    if why is not None:
        require_tool("network namespaces and a private PostgreSQL", None, why)
    result = partition.soak(tmp_path, [1.0, 10.0])
    print({k: v for k, v in result.items() if k != "findings"})  # the figures, under -s
    assert result["findings"] == [], result
    assert result["runs"] >= 100 and result["starts"] >= 3 * result["runs"]
    for cut in result["cuts"]:
        assert cut["resumed_after_s"] is not None
        assert cut["resumed_after_s"] <= partition.RESUME_BOUND
    # the 10 s cut outlasts the ttl: its leases were taken over and its late commits refused
    assert result["zombie_writes_rejected"] >= 1
