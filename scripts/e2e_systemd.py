"""deploy/systemd's unit under a real systemd as PID 1 (scripts/e2e-systemd runs this as root).

A minimal Debian (cached debootstrap) boots in systemd-nspawn; leasekeeper is installed from a
clean ``git archive`` of HEAD with the unit and environment file of that commit (two workers, the
app of scripts/e2e_app.py). Then, one PASS/FAIL line each:

  start     the unit stays "activating" while the app's import is held, becomes active only
            after READY=1 (systemd's own log order), and STATUS= shows in systemctl status
  reload    `systemctl reload` returns 0 only once every worker runs the new code
  reload-failing  a syntax error: `systemctl reload` fails, STATUS says why, health is 0, the
            old workers keep serving; the next good reload clears it
  watchdog  SIGSTOP of the main process: systemd's watchdog kills and restarts it; runs finish
  stop      `systemctl stop` drains (the tasks in flight finish, exit 0), no process is left,
            nothing is leased
  kill      `systemctl kill -s KILL` of the main process: its workers die with it, the unit
            restarts, and the leases they held are taken over; runs finish

Exit 0 when every check passed, 1 when one failed, 2 when the container could not be built or
driven. Every wait is bounded; the container is powered off and deleted on every way out.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from e2e_container import DEFAULT_CACHE, Container, E2EError, base_tree, log

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
UNIT = "leasekeeper.service"
DB = "/var/lib/leasekeeper/leasekeeper.db"
PIDFILE = "/run/leasekeeper/supervisor.pid"
APP = "/opt/leasekeeper/app/e2eapp.py"
GATE = "/opt/leasekeeper/app/gate"
SV = "/opt/leasekeeper/bin/supervisor"
PROBE = "/opt/leasekeeper/bin/python /opt/leasekeeper/e2e_probe.py " + DB
WORKERS = 2


class CheckFailed(Exception):
    pass


class Checks:
    def __init__(self, c: Container) -> None:
        self.c = c
        self.results: list[tuple[str, bool, str]] = []

    # -- plumbing --------------------------------------------------------------------------
    def sh(self, script: str, timeout: float = 60.0) -> str:
        proc = self.c.sh(script, timeout)
        if proc.returncode != 0:
            raise CheckFailed(f"`{script}` exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def as_service_user(self, command: str, timeout: float = 60.0) -> str:
        """As the unit's user: a root-owned -shm next to its database would lock it out."""
        return self.sh(f"runuser -u leasekeeper -- {command}", timeout)

    def probe(self, *args: str) -> Any:
        return json.loads(self.as_service_user(PROBE + " " + shlex.join(args)))

    def show(self, *props: str) -> dict[str, str]:
        text = self.sh(f"systemctl show {UNIT} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def state(self) -> dict[str, Any]:
        return json.loads(self.sh(f"cat {PIDFILE}.state"))  # type: ignore[no-any-return]

    def journal(self) -> list[dict[str, Any]]:
        text = self.sh(f"journalctl -u {UNIT} -o json --no-pager", 60)
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for entry in self.journal():
            message = entry.get("MESSAGE")
            if isinstance(message, str) and message.startswith("{"):
                try:
                    doc = json.loads(message)
                except ValueError:
                    continue
                if doc.get("event") == name:
                    found.append(doc)
        return found

    def messages(self, needle: str) -> list[str]:
        return [
            m
            for e in self.journal()
            if isinstance(m := e.get("MESSAGE"), str) and needle in m
        ]  # fmt: skip

    @staticmethod
    def wait(predicate: Callable[[], T], timeout: float, what: str) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise CheckFailed(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.3)

    def active_pids(self) -> list[int]:
        return [w["pid"] for w in self.state()["workers"] if w["retiring"] is None]

    def gone(self, pids: list[int]) -> bool:
        alive = self.c.sh(" ; ".join(f"test -d /proc/{p} && echo {p}" for p in pids) + "; true")
        return alive.stdout.strip() == ""

    def enqueue(self, count: int, steps: int, seconds: float) -> list[int]:
        payload = json.dumps({"s": seconds, "left": steps - 1})
        return self.probe("enqueue", "step", str(count), payload)  # type: ignore[no-any-return]

    def runs(self, ids: list[int]) -> dict[str, Any]:
        return self.probe("runs", *map(str, ids))  # type: ignore[no-any-return]

    def tasks(self, runs: list[int], leases: list[dict[str, Any]]) -> dict[int, Any]:
        """The tasks of ``runs`` and of the runs ``leases`` belong to (an earlier check's)."""
        ids = sorted(set(runs) | {lease["run_id"] for lease in leases})
        return {t["id"]: t for r in self.runs(ids).values() for t in r["tasks"]}

    def all_succeeded(self, ids: list[int], timeout: float) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            runs = self.runs(ids)
            return runs if all(r["status"] == "succeeded" for r in runs.values()) else None

        return self.wait(done, timeout, f"{len(ids)} runs to succeed")

    def write_app(self, version: str, broken: bool = False) -> None:
        source = (self.c.root / "src/leasekeeper/scripts/e2e_app.py").read_text()
        source = source.replace('VERSION = "v1"', f"VERSION = {version!r}")
        if broken:
            source += "\ndef broken(:\n"
        self.c.write(APP, source)

    def ensure_active(self) -> None:
        """Before a check: the unit runs (an earlier failed check may have left it down)."""
        if self.show("ActiveState")["ActiveState"] != "active":
            self.sh(f"systemctl reset-failed {UNIT}; systemctl start {UNIT}", 150)

    # -- running ---------------------------------------------------------------------------
    def run(self, name: str, check: Callable[[], str]) -> None:
        started = time.monotonic()
        try:
            detail = check()
            ok = True
        except (CheckFailed, E2EError, KeyError, ValueError) as exc:
            detail, ok = str(exc), False
        took = time.monotonic() - started
        self.results.append((name, ok, detail))
        print(f"{'PASS' if ok else 'FAIL'} {name} ({took:.1f}s): {detail}", flush=True)
        if not ok:
            tail = self.c.sh(f"journalctl -u {UNIT} -o cat --no-pager | tail -n 25", 60).stdout
            print("  journal tail:\n    " + tail.strip().replace("\n", "\n    "), flush=True)

    # -- the checks ------------------------------------------------------------------------
    def start(self) -> str:
        self.sh(f"systemctl start --no-block {UNIT}")
        self.wait(lambda: self.show("MainPID")["MainPID"] != "0", 60, "the main process")
        states = set()
        for _ in range(10):  # 3 s with the app's import held: no READY, so not active
            states.add(self.show("ActiveState")["ActiveState"])
            time.sleep(0.3)
        if states != {"activating"}:
            raise CheckFailed(f"expected only 'activating' before READY, saw {sorted(states)}")
        self.sh(f"touch {GATE}")
        self.wait(lambda: self.show("ActiveState")["ActiveState"] == "active", 60, "active")
        status = self.show("StatusText")["StatusText"]
        if f"{WORKERS}/{WORKERS} workers up" not in status:
            raise CheckFailed(f"StatusText: {status!r}")
        shown = self.sh(f"systemctl status {UNIT} --no-pager")
        if f'Status: "{WORKERS}/{WORKERS} workers up' not in shown:
            raise CheckFailed("systemctl status does not show STATUS=")
        order = [
            "READY" if "READY=1" in m else "active"
            for e in self.journal()
            if e.get("_PID") == "1"
            and isinstance(m := e.get("MESSAGE"), str)
            and (("notification message" in m and "READY=1" in m) or m.startswith("Started "))
        ]
        if order[:2] != ["READY", "active"]:
            raise CheckFailed(f"systemd's log order: {order}")
        return (
            f"activating while the import was held, active only after READY=1 "
            f"(systemd logged {' then '.join(order[:2])}); {status!r}"
        )

    def reload_good(self) -> str:
        self.ensure_active()
        before = self.active_pids()
        self.write_app("v2-reloaded")
        started = time.monotonic()
        proc = self.c.sh(f"systemctl reload {UNIT}", 200)
        took = time.monotonic() - started
        if proc.returncode != 0:
            raise CheckFailed(f"systemctl reload exited {proc.returncode}: {proc.stderr.strip()}")
        state = self.state()  # read the moment systemctl returned
        record = state["reload"]
        active = [w for w in state["workers"] if w["retiring"] is None]
        if record["status"] != "done" or {w["generation"] for w in active} != {
            record["generation"]
        }:
            raise CheckFailed(f"systemctl reload returned before the roll was done: {record}")
        if set(before) & {w["pid"] for w in active}:
            raise CheckFailed("old workers still active after the reload")
        (run,) = self.probe("enqueue", "version", "1", "null")
        result = self.all_succeeded([run], 60)[str(run)]["result"]
        if result != {"version": "v2-reloaded"}:
            raise CheckFailed(f"a run after the reload returned {result}")
        notes = self.messages("RELOADING=1")
        if not notes or "MONOTONIC_USEC=" not in notes[-1]:
            raise CheckFailed("no RELOADING=1 with MONOTONIC_USEC in systemd's log")
        return (
            f"returned 0 after {took:.1f}s with reload {record['id']} done: {len(active)} "
            f"workers on generation {record['generation']}; a new run says {result}"
        )

    def reload_failing(self) -> str:
        self.ensure_active()
        before = sorted(self.active_pids())
        self.write_app("v3-broken", broken=True)
        proc = self.c.sh(f"systemctl reload {UNIT}", 200)
        if proc.returncode == 0:
            raise CheckFailed("systemctl reload returned 0 on a syntax error")
        status = self.show("StatusText", "ActiveState")
        if not status["StatusText"].startswith("reload failed: cannot import 'e2eapp'"):
            raise CheckFailed(f"StatusText: {status['StatusText']!r}")
        if status["ActiveState"] != "active":
            raise CheckFailed(f"the unit is {status['ActiveState']} after a failed reload")
        health = self.c.sh(f"runuser -u leasekeeper -- {SV} health --pidfile {PIDFILE}", 60)
        if health.returncode != 0:
            raise CheckFailed(f"health exited {health.returncode}: {health.stderr.strip()}")
        if sorted(self.active_pids()) != before:
            raise CheckFailed("the old workers were replaced by a failed reload")
        line = next(iter(self.messages("supervisor: error: reload")), "")
        (run,) = self.probe("enqueue", "version", "1", "null")
        result = self.all_succeeded([run], 60)[str(run)]["result"]
        if result != {"version": "v2-reloaded"}:
            raise CheckFailed(f"the old workers answered {result}")
        self.write_app("v3-fixed")
        fixed = self.c.sh(f"systemctl reload {UNIT}", 200)
        after = self.show("StatusText")["StatusText"]
        if fixed.returncode != 0 or after.startswith("reload failed"):
            raise CheckFailed(f"the next good reload: exit {fixed.returncode}, {after!r}")
        return (
            f"systemctl reload exited {proc.returncode} ({proc.stderr.strip().splitlines()[0]}); "
            f"ExecReload said {line!r}; STATUS={status['StatusText'][:90]!r}…; health 0; "
            f"old workers {before} kept serving v2-reloaded; the next good reload returned 0"
        )

    def watchdog(self) -> str:
        self.ensure_active()
        runs = self.enqueue(12, 3, 0.3)
        props = self.show("MainPID", "NRestarts", "WatchdogUSec")
        old, restarts = props["MainPID"], int(props["NRestarts"])
        self.sh(f"kill -STOP {old}")
        stopped = time.monotonic()

        def restarted() -> bool:
            now = self.show("MainPID", "NRestarts", "ActiveState")
            return (
                int(now["NRestarts"]) > restarts
                and now["MainPID"] not in ("0", old)
                and now["ActiveState"] == "active"
            )

        self.wait(restarted, 180, "systemd to kill and restart the stopped supervisor")
        took = time.monotonic() - stopped
        if not self.messages("Watchdog timeout"):
            raise CheckFailed("no 'Watchdog timeout' in the journal")
        if not self.gone([int(old)]):
            raise CheckFailed(f"the stopped supervisor {old} is still there")
        self.all_succeeded(runs, 180)
        new = self.show("MainPID")["MainPID"]
        return (
            f"WatchdogSec={props['WatchdogUSec']}: supervisor {old} stopped, "
            f"killed and replaced by {new} after {took:.0f}s; {len(runs)} runs succeeded"
        )

    def stop(self) -> str:
        self.ensure_active()
        runs = self.enqueue(4, 2, 3.0)
        leases = self.wait(lambda: self.probe("leases"), 60, "a task in flight")
        killed_before = len(self.events("worker_killed"))
        started = time.monotonic()
        self.sh(f"systemctl stop {UNIT}", 120)
        took = time.monotonic() - started
        props = self.show("ActiveState", "Result", "ExecMainStatus", "MainPID")
        if (props["ActiveState"], props["Result"], props["ExecMainStatus"]) != (
            "inactive",
            "success",
            "0",
        ):
            raise CheckFailed(f"after stop: {props}")
        left = self.c.sh("ps -o pid=,comm= -u leasekeeper", 30).stdout.strip()
        if left:
            raise CheckFailed(f"processes left: {left}")
        still = self.probe("leases")
        if still:
            raise CheckFailed(f"still leased after stop: {still}")
        if len(self.events("worker_killed")) != killed_before:
            raise CheckFailed("a worker had to be SIGKILLed: the drain did not finish")
        tasks = self.tasks(runs, leases)
        for lease in leases:
            task = tasks.get(lease["task_id"])
            if not task or not task["done"] or task["attempts"] != lease["attempt"]:
                raise CheckFailed(f"task {lease['task_id']} in flight at stop did not finish")
        return (
            f"stopped in {took:.1f}s with exit status 0; the {len(leases)} task(s) in flight "
            "finished on their attempt; no process left; nothing leased"
        )

    def kill(self) -> str:
        self.ensure_active()
        runs = self.enqueue(4, 2, 3.0)
        leases = self.wait(lambda: self.probe("leases"), 60, "a task in flight")
        workers = [w["pid"] for w in self.state()["workers"]]
        props = self.show("MainPID", "NRestarts")
        old, restarts = props["MainPID"], int(props["NRestarts"])
        self.sh(f"systemctl kill -s KILL --kill-who=main {UNIT}")
        self.wait(lambda: self.gone([int(old), *workers]), 30, "the killed supervisor's workers")
        self.wait(
            lambda: (
                int(self.show("NRestarts")["NRestarts"]) > restarts
                and self.show("ActiveState")["ActiveState"] == "active"
            ),
            90,
            "the restart",
        )
        self.all_succeeded(sorted(set(runs) | {lease["run_id"] for lease in leases}), 180)
        tasks = self.tasks(runs, leases)
        for lease in leases:
            task = tasks[lease["task_id"]]
            if task["attempts"] <= lease["attempt"]:
                raise CheckFailed(f"task {lease['task_id']} was not taken over: {task}")
        released = [e for e in self.events("leases_released") if "dead before" in e["msg"]]
        if not released:
            raise CheckFailed("the new supervisor did not release the dead workers' leases")
        return (
            f"supervisor {old} SIGKILLed: its workers {workers} died with it; the unit "
            f"restarted; {len(leases)} lease(s) released at start-up and taken over by a new "
            f"attempt; {len(runs)} runs succeeded"
        )


def install(c: Container) -> None:
    tree = c.root / "src/leasekeeper"
    c.write("/opt/leasekeeper/e2e_probe.py", (tree / "scripts/e2e_probe.py").read_text())
    env = (tree / "deploy/systemd/leasekeeper.env").read_text()
    overrides = {
        "SUPERVISOR_WORKERS": str(WORKERS),
        "SUPERVISOR_APP": "e2eapp:app",
        "SUPERVISOR_LOG_FORMAT": "json",
    }
    lines = [ln for ln in env.splitlines() if ln.split("=", 1)[0] not in overrides]
    lines += [f"{k}={v}" for k, v in overrides.items()] + ["PYTHONPATH=/opt/leasekeeper/app"]
    c.write("/etc/leasekeeper/leasekeeper.env", "\n".join(lines) + "\n", mode=0o640)
    checks = Checks(c)
    checks.write_app("v1")
    script = (
        "useradd --system --home-dir /var/lib/leasekeeper --shell /usr/sbin/nologin leasekeeper"
        " && install -m 0644 /src/leasekeeper/deploy/systemd/leasekeeper.service"
        " /etc/systemd/system/ && systemctl daemon-reload && systemctl log-level debug"
    )
    proc = c.sh(script, 120)
    if proc.returncode != 0:
        raise E2EError(f"installing the unit failed: {proc.stderr.strip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="debootstrap cache")
    parser.add_argument(
        "--fresh", action="store_true", help="build the Debian tree from scratch (not cached)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))  # clean up on TERM as on Ctrl-C
    cache = Path(tempfile.mkdtemp(prefix="leasekeeper-e2e-cache-")) if args.fresh else args.cache
    started = time.monotonic()
    container: Container | None = None
    try:
        container = Container(base_tree(cache), REPO, cache)
        container.prepare()
        container.boot()
        install(container)
        checks = Checks(container)
        for name, check in [
            ("start", checks.start),
            ("reload", checks.reload_good),
            ("reload-failing", checks.reload_failing),
            ("watchdog", checks.watchdog),
            ("stop", checks.stop),
            ("kill", checks.kill),
        ]:
            checks.run(name, check)
    except E2EError as exc:
        print(f"ERROR: the container could not be set up or driven: {exc}", flush=True)
        return 2
    finally:
        if container is not None:
            log("powering the container off")
            container.close()
        if args.fresh:
            shutil.rmtree(cache, ignore_errors=True)
    failed = [name for name, ok, _ in checks.results if not ok]
    verdict = f"FAILED: {', '.join(failed)}" if failed else "all checks passed"
    print(f"== e2e-systemd: {len(checks.results)} checks, {verdict} "
          f"({time.monotonic() - started:.0f}s)")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
