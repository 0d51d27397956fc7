"""Hosts as Linux network namespaces on this machine, and a network cut between one and the
database (nftables).

Each host is a namespace joined to the root namespace by a veth pair: the host side
``10.<net>.<k>.1/30`` (where a private PostgreSQL listens, pg_private.py), the namespace side
``10.<net>.<k>.2``. ``cut`` loads a table of the namespace's own that drops every packet in and
out of its veth, as a switch that stops forwarding would: connections are not refused or reset,
they hang; ``heal`` deletes it. Everything (tables included: they live in the namespace) goes
away with the namespace, deleted on exit even after a failure. Names carry this process's pid,
so two runs side by side never meet.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

TABLE = "lk_cut"


def missing() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y {package}; .ci/run does it)"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done


@dataclass
class Host:
    name: str  # the namespace
    outer: str  # the veth end in the root namespace
    inner: str  # the veth end in the namespace
    gateway: str  # the root side's address: where the database listens for this host
    address: str  # the namespace side's address
    cut_now: bool = False

    def wrap(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run inside this host (``ip netns exec`` execs it: the same pid)."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def cut(self) -> None:
        """Drop every packet between this host and the rest (its loopback still works)."""
        rules = (
            f"table inet {TABLE} {{\n"
            f"  chain cut_in {{ type filter hook input priority -10; policy accept;\n"
            f'    iifname "{self.inner}" drop; }}\n'
            f"  chain cut_out {{ type filter hook output priority -10; policy accept;\n"
            f'    oifname "{self.inner}" drop; }}\n'
            "}\n"
        )
        done = subprocess.run(self.wrap(["nft", "-f", "-"]), input=rules, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"nft: {done.stderr.strip()}")
        self.cut_now = True

    def heal(self) -> None:
        if self.cut_now:
            _run(*self.wrap(["nft", "delete", "table", "inet", TABLE]))
            self.cut_now = False


def _net() -> int:
    """The second octet of this run's addresses: from the pid, away from common ranges."""
    return 100 + os.getpid() % 100


@contextlib.contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """``count`` namespaces, each with its veth pair up; deleted on exit."""
    tag = f"{os.getpid() % 100000}"
    made: list[Host] = []
    try:
        for k in range(1, count + 1):
            host = Host(
                name=f"lkpart{tag}h{k}", outer=f"lk{tag}o{k}", inner=f"lk{tag}i{k}",
                gateway=f"10.{_net()}.{k}.1", address=f"10.{_net()}.{k}.2",
            )  # fmt: skip
            _run("ip", "netns", "add", host.name)
            made.append(host)
            _run("ip", "link", "add", host.outer, "type", "veth", "peer", "name", host.inner)
            _run("ip", "link", "set", host.inner, "netns", host.name)
            _run("ip", "addr", "add", f"{host.gateway}/30", "dev", host.outer)
            _run("ip", "link", "set", host.outer, "up")
            _run(*host.wrap(["ip", "addr", "add", f"{host.address}/30", "dev", host.inner]))
            _run(*host.wrap(["ip", "link", "set", host.inner, "up"]))
            _run(*host.wrap(["ip", "link", "set", "lo", "up"]))
        yield made
    finally:
        for host in made:
            _run("ip", "netns", "delete", host.name, check=False)  # its veth pair goes with it
            _run("ip", "link", "delete", host.outer, check=False)  # (gone already: harmless)
