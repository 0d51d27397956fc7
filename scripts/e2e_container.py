"""A throwaway Debian with systemd as PID 1, for scripts/e2e-systemd (host side, stdlib only).

- ``base_tree``: debootstrap a minimal bookworm once and keep it in a cache outside the repository,
  keyed by everything that goes into it (suite, variant, packages, mirror, architecture, recipe),
  so a rerun skips the slow part and a changed input builds a new tree. Built in a temporary
  directory and renamed into place: an interrupted build never leaves a half tree behind.
- ``Container``: a private copy of that tree, the project installed into a venv from a clean
  ``git archive`` of HEAD, booted with ``systemd-nspawn -b``; commands run inside through
  ``nsenter`` into the container's PID 1; ``close`` powers it off (SIGKILL of the nspawn process
  we started, by its pid, only if poweroff does not finish) and deletes the copy.

Every wait is bounded. Needs root, systemd-nspawn, debootstrap and nsenter.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

SUITE = "bookworm"  # Debian 12: systemd 252, Python 3.11
VARIANT = "minbase"
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "python3-pip", "sqlite3",
    "procps", "psmisc",
)  # fmt: skip
MASKED = ("dbus.service", "dbus.socket", "systemd-logind.service")
RECIPE = 1  # bump when base_tree's post-processing changes
DEFAULT_CACHE = Path(os.environ.get("LEASEKEEPER_E2E_CACHE", "/var/cache/leasekeeper-e2e"))
DEBOOTSTRAP_TIMEOUT = 3600.0
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


class E2EError(Exception):
    """The container could not be built, booted or driven (not a failed check)."""


def log(message: str) -> None:
    print(f"-- {message}", flush=True)


def run(
    cmd: Sequence[str], timeout: float, *, check: bool = True, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, input=input_text
        )
    except subprocess.TimeoutExpired:
        raise E2EError(f"timed out after {timeout:g}s: {' '.join(cmd)}") from None
    if check and proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise E2EError(f"exit {proc.returncode}: {' '.join(cmd)}\n" + "\n".join(tail))
    return proc


def apt_mirror() -> str:
    """The Debian mirror apt already uses on this host (deb822 or one-line sources)."""
    if env := os.environ.get("LEASEKEEPER_E2E_MIRROR"):
        return env
    paths = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    paths += [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]
    for path in paths:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                words = line.split()
                if line.startswith("URIs:"):
                    for uri in words[1:]:
                        if uri.rstrip("/").endswith("/debian"):
                            return uri
                elif words[:1] == ["deb"]:
                    uri = next((w for w in words[1:] if "://" in w), "")
                    if uri.rstrip("/").endswith("/debian"):
                        return uri
    return "http://deb.debian.org/debian"


def base_key(mirror: str) -> str:
    arch = run(["dpkg", "--print-architecture"], 30).stdout.strip()
    inputs = {
        "suite": SUITE,
        "variant": VARIANT,
        "packages": sorted(PACKAGES),
        "mirror": mirror,
        "arch": arch,
        "recipe": RECIPE,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def base_tree(cache: Path = DEFAULT_CACHE) -> Path:
    """The cached debootstrap tree for the current inputs; built when missing."""
    mirror = apt_mirror()
    tree = cache / f"{SUITE}-{VARIANT}-{base_key(mirror)}"
    if (tree / ".complete").exists():
        log(f"reusing the cached Debian tree {tree}")
        return tree
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="building-", dir=cache))
    log(f"debootstrap {SUITE} ({VARIANT}) from {mirror} into {building} (takes minutes)")
    started = time.monotonic()
    try:
        run(
            ["debootstrap", f"--variant={VARIANT}", "--include=" + ",".join(PACKAGES),
             SUITE, str(building), mirror],
            DEBOOTSTRAP_TIMEOUT,
        )  # fmt: skip
        building.chmod(0o755)  # the container's / (mkdtemp made it 0700)
        (building / "etc/hostname").write_text("e2e\n")
        with contextlib.suppress(FileNotFoundError):
            (building / "etc/machine-id").unlink()
        run(["systemd-machine-id-setup", f"--root={building}"], 60)
        (building / ".complete").write_text(f"built in {time.monotonic() - started:.0f}s\n")
        if tree.exists():  # a stale, incomplete tree of an older attempt
            shutil.rmtree(tree)
        building.rename(tree)
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)
    log(f"Debian tree ready in {time.monotonic() - started:.0f}s: {tree}")
    return tree


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                found += [int(p) for p in text.split()]
    return found


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


class Container:
    """One booted container: a private copy of the base tree, removed by ``close``."""

    def __init__(self, base: Path, repo: Path, cache: Path = DEFAULT_CACHE) -> None:
        self.base = base
        self.repo = repo
        self.cache = cache
        self.root = Path(tempfile.mkdtemp(prefix="leasekeeper-e2e-", dir="/var/tmp"))
        self.nspawn: subprocess.Popen[bytes] | None = None
        self.leader: int | None = None
        self.console = self.root.with_suffix(".console.log")

    # -- set-up --------------------------------------------------------------------------
    def prepare(self) -> None:
        log(f"copying the tree to {self.root}")
        run(["cp", "-a", "--reflink=auto", f"{self.base}/.", str(self.root)], 900)
        self.root.chmod(0o755)  # mkdtemp made it 0700: the service's user could not chdir to /
        src = self.root / "src/leasekeeper"
        src.mkdir(parents=True)
        head = run(["git", "-C", str(self.repo), "rev-parse", "--short", "HEAD"], 30).stdout
        log(f"installing leasekeeper from a clean git archive of HEAD ({head.strip()})")
        archive = subprocess.run(
            ["git", "-C", str(self.repo), "archive", "--format=tar", "HEAD"],
            capture_output=True,
            timeout=120,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True, timeout=120)
        # No bus in the container: dbus-daemon cannot start in some sandboxes (its inotify is
        # refused, activation times out) and boot never finishes. systemctl as root talks to
        # PID 1 over its private socket and needs neither dbus nor logind.
        for unit in MASKED:
            (self.root / "etc/systemd/system" / unit).symlink_to("/dev/null")
        if HOST_CA.exists():  # pip inside the tree trusts what the host trusts (proxies too)
            shutil.copy(HOST_CA, self.root / "etc/ssl/host-ca.crt")
        pip_cache = self.cache / "pip"
        pip_cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        run(
            ["systemd-nspawn", "-q", "-D", str(self.root), "--register=no", "--keep-unit",
             f"--bind={pip_cache}:/root/.cache/pip", "--setenv=PIP_CERT=/etc/ssl/host-ca.crt",
             "--setenv=PIP_DISABLE_PIP_VERSION_CHECK=1", "sh", "-c",
             "python3 -m venv /opt/leasekeeper && /opt/leasekeeper/bin/pip install -q "
             "/src/leasekeeper"],
            900,
        )  # fmt: skip

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a file into the container's tree (from the host, before or after boot)."""
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".e2e-tmp")
        tmp.write_text(text)
        tmp.chmod(mode)
        tmp.rename(target)

    # -- boot and drive --------------------------------------------------------------------
    def boot(self, timeout: float = 180.0) -> None:
        log("booting systemd as PID 1 in the container")
        with open(self.console, "wb") as out:
            self.nspawn = subprocess.Popen(
                ["systemd-nspawn", "-q", "-b", "-D", str(self.root), "--register=no",
                 "--keep-unit", "--private-network", "--console=passive"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        ours = _pid_ns(os.getpid())
        while self.leader is None:
            if self.nspawn.poll() is not None:
                raise E2EError(f"systemd-nspawn exited ({self.nspawn.returncode}): {self.tail()}")
            if time.monotonic() > deadline:
                raise E2EError(f"the container's systemd did not appear in {timeout:g}s")
            queue = _children(self.nspawn.pid)
            while queue:
                pid = queue.pop()
                ns = _pid_ns(pid)
                if ns is not None and ns != ours:  # the first process in the new pid namespace
                    self.leader = pid
                    break
                queue += _children(pid)
            time.sleep(0.2)
        left = max(1.0, deadline - time.monotonic())
        state = self.sh(f"timeout {left:.0f} systemctl is-system-running --wait", left + 10)
        if state.stdout.strip() not in ("running", "degraded"):
            jobs = self.sh("systemctl list-jobs --no-pager", 30).stdout.strip()
            raise E2EError(f"the container did not boot: {state.stdout.strip()}\n{jobs}")
        log(f"container up: systemd {self.leader} ({state.stdout.strip()})")

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.console.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def sh(
        self, script: str, timeout: float = 60.0, *, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run ``script`` with sh inside the container (all of its namespaces, as root)."""
        if self.leader is None:
            raise E2EError("the container is not booted")
        cmd = ["nsenter", "-t", str(self.leader), "-a", "--", "/bin/sh", "-c", script]
        return run(cmd, timeout, check=check)

    # -- tear-down -------------------------------------------------------------------------
    def close(self) -> None:
        if self.nspawn is not None and self.nspawn.poll() is None:
            if self.leader is not None:
                with contextlib.suppress(E2EError):
                    self.sh("systemctl poweroff --no-block", 30)
            try:
                self.nspawn.wait(60)
            except subprocess.TimeoutExpired:
                log("the container did not power off within 60s: killing our systemd-nspawn")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.nspawn.pid, signal.SIGKILL)
                self.nspawn.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.console.unlink()


if __name__ == "__main__":  # warm the cache: python3 scripts/e2e_container.py
    print(base_tree())
    sys.exit(0)
