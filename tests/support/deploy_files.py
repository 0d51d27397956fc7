"""The shipped deployment files the deploy tests read and run."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/support/ -> the repository
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "leasekeeper.service"
ENV_FILE = DEPLOY / "systemd" / "leasekeeper.env"
SUPERVISORD_CONF = DEPLOY / "supervisord" / "leasekeeper.conf"
DOCKERFILE = DEPLOY / "container" / "Dockerfile"
K8S = DEPLOY / "container" / "k8s.yaml"
