"""The deploy files: the systemd unit through ``systemd-analyze verify`` (and its offline security
review), the supervisord drop-in, the Dockerfile and the Kubernetes manifest. The container files
cannot run here (no container engine): they are parsed and checked for what a deployment needs
(exec-form entrypoint, non-root user, a volume, TERM, grace periods, an exec liveness probe).

``.ci/run`` installs the tools and sets LEASEKEEPER_REQUIRE_TOOLS=1: then a missing tool fails
instead of skipping."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from deploy_files import DOCKERFILE, ENV_FILE, K8S, ROOT, SUPERVISORD_CONF, UNIT
from tools import require_tool

from supervisor.config import Timing
from workerproc.config import WorkerConfig

GRACE = WorkerConfig(db="x", app="m:a").graceful_timeout  # the default --graceful-timeout
FAST_STOP = Timing().fast_stop_grace


# -- systemd -------------------------------------------------------------------------------
def unit_sections(text: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, val = line.partition("=")
        current.setdefault(key.strip(), []).append(val.strip())
    return sections


def env_file() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_FILE.read_text().splitlines())
    return {k: v for k, v in (p for p in pairs if len(p) == 2) if not k.startswith("#")}


def runnable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's console script (verify checks that
    the binary exists; /opt/leasekeeper is where an operator installs it)."""
    script = Path(sys.executable).parent / "supervisor"
    assert script.exists(), f"console script missing: {script}"
    text = UNIT.read_text().replace("/opt/leasekeeper/bin/supervisor", str(script))
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    return unit


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze", shutil.which("systemd-analyze"), "systemd")
    unit = runnable_unit(tmp_path)
    proc = subprocess.run(
        [tool, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    ours = [ln for ln in (proc.stdout + proc.stderr).splitlines() if unit.name in ln]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ours == [], "systemd-analyze complains about the unit:\n" + "\n".join(ours)


def test_unit_hardening_scores_ok_offline(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze", shutil.which("systemd-analyze"), "systemd")
    proc = subprocess.run(
        [tool, "security", "--offline=yes", "--no-pager", str(runnable_unit(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", proc.stdout + proc.stderr)
    assert m, proc.stdout + proc.stderr
    assert float(m.group(1)) <= 3.0  # 0 = locked down ... 10 = fully exposed


def test_unit_settings_the_issue_pins() -> None:
    service = unit_sections(UNIT.read_text())["Service"]
    one = {k: v[-1] for k, v in service.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert int(one["WatchdogSec"]) >= 10
    # systemctl reload waits for the roll and fails when it failed, within the
    # TimeoutStartSec= that systemd applies to ExecReload=
    reload = shlex.split(one["ExecReload"])
    assert reload[:4] == ["/opt/leasekeeper/bin/supervisor", "reload", "--wait", "--timeout"]
    assert float(reload[4]) < int(one["TimeoutStartSec"])
    assert one["Environment"] == "SUPERVISOR_PIDFILE=/run/leasekeeper/supervisor.pid"
    assert one["KillMode"] == "mixed"
    assert one["Restart"] == "on-failure"
    assert one["StateDirectory"] == "leasekeeper"
    for key in ("NoNewPrivileges", "PrivateTmp", "ProtectHome"):
        assert one[key] == "yes"
    assert one["ProtectSystem"] == "strict"
    assert "AF_UNIX" in one["RestrictAddressFamilies"]  # the notify socket
    env = env_file()
    grace = float(env.get("SUPERVISOR_GRACEFUL_TIMEOUT", GRACE))
    assert int(one["TimeoutStopSec"]) > grace + FAST_STOP
    assert env["SUPERVISOR_DB"].startswith("/var/lib/leasekeeper/")  # inside StateDirectory
    assert env["SUPERVISOR_PIDFILE"].startswith("/run/leasekeeper/")  # inside RuntimeDirectory
    assert one["EnvironmentFile"].lstrip("-") == "/etc/leasekeeper/leasekeeper.env"


# -- supervisord ---------------------------------------------------------------------------
def supervisord_program() -> dict[str, str]:
    parser = configparser.RawConfigParser(comment_prefixes=(";", "#"), interpolation=None)
    parser.read(SUPERVISORD_CONF)
    return dict(parser["program:leasekeeper"])


def test_supervisord_program_stops_gracefully() -> None:
    prog = supervisord_program()
    argv = shlex.split(prog["command"])
    grace = float(argv[argv.index("--graceful-timeout") + 1])
    assert prog["stopsignal"] == "TERM"
    assert int(prog["stopwaitsecs"]) > grace + FAST_STOP
    assert prog["stopasgroup"] == "false" and prog["killasgroup"] == "true"
    assert prog["autorestart"] == "unexpected" and prog["exitcodes"] == "0"
    assert prog["redirect_stderr"] == "true" and prog["stdout_logfile"].startswith("/var/log/")
    assert "numprocs" not in prog  # one pool; workers are forked by our supervisor


# -- containers ----------------------------------------------------------------------------
def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_structure() -> None:
    ins = dockerfile_instructions()
    kinds = [k for k, _ in ins]
    assert kinds[0] == "FROM"
    known = {"FROM", "ENV", "RUN", "WORKDIR", "COPY", "VOLUME", "EXPOSE", "USER", "HEALTHCHECK",
             "ENTRYPOINT", "CMD", "ARG", "LABEL", "STOPSIGNAL"}  # fmt: skip
    assert set(kinds) <= known, set(kinds) - known
    entry = json.loads(dict(ins)["ENTRYPOINT"])  # exec form: the supervisor is PID 1, gets TERM
    assert entry == ["supervisor", "start"]
    assert isinstance(json.loads(dict(ins)["CMD"]), list)
    stop = [v for k, v in ins if k == "STOPSIGNAL"]
    assert stop in ([], ["SIGTERM"]), "TERM is the graceful stop"
    user = [v for k, v in ins if k == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert kinds.index("USER") < kinds.index("ENTRYPOINT")
    volumes = json.loads(dict(ins)["VOLUME"])
    env = " ".join(v for k, v in ins if k == "ENV")
    db = re.search(r"SUPERVISOR_DB=(\S+)", env)
    assert db and any(db.group(1).startswith(v + "/") for v in volumes)
    health = dict(ins)["HEALTHCHECK"]
    assert json.loads(health.split("CMD", 1)[1])[:2] == ["supervisor", "health"]
    installs = [v for k, v in ins if k == "RUN" and "pip install" in v]
    assert installs and '".[postgres,web]"' in installs[-1]  # a PostgreSQL URL, the dashboard
    for k, v in ins:  # every COPY source exists in the build context (the repository root)
        if k == "COPY":
            for src in v.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"


def load_yaml_documents(path: Path) -> list[Any] | None:
    """Parse with PyYAML: ours if installed, else the system Python's (python3-yaml)."""
    try:
        import yaml  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:
        pass
    else:
        return list(yaml.safe_load_all(path.read_text()))
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system:
        code = "import json,sys,yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))"
        proc = subprocess.run(
            [system, "-c", code], input=path.read_text(), capture_output=True, text=True
        )
        if proc.returncode == 0:
            return list(json.loads(proc.stdout))
        assert "No module named 'yaml'" in proc.stderr, proc.stderr  # a parse error fails here
    return None


def test_k8s_manifest() -> None:
    text = K8S.read_text()
    assert "\t" not in text
    docs = load_yaml_documents(K8S)
    if docs is None:
        require_tool("PyYAML", None, "python3-yaml")
        return
    by_kind = {d["kind"]: d for d in docs if d}
    assert set(by_kind) == {"PersistentVolumeClaim", "Deployment"}
    assert by_kind["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    deploy = by_kind["Deployment"]
    spec = deploy["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"  # one SQLite writer
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    grace = float(env.get("SUPERVISOR_GRACEFUL_TIMEOUT", GRACE))
    assert pod["terminationGracePeriodSeconds"] > grace + FAST_STOP
    probe = container["livenessProbe"]["exec"]["command"]
    assert probe[:2] == ["supervisor", "health"]
    assert probe[probe.index("--pidfile") + 1] == env["SUPERVISOR_PIDFILE"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert os.path.dirname(env["SUPERVISOR_PIDFILE"]) in mounts  # read-only root elsewhere
    assert os.path.dirname(env["SUPERVISOR_DB"]) in mounts
    user = [v for k, v in dockerfile_instructions() if k == "USER"][-1].split(":")[0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == user
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "PostgreSQL" in text and "ReadWriteOnce" in text  # the note on several pods
