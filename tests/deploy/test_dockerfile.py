"""The Dockerfile and its build context, without building (see test_image.py for the build)."""

from __future__ import annotations

import fnmatch
import tomllib

from tests.deploy.support import DOCKERFILE, REPO, run, tool


def test_hadolint_clean() -> None:
    result = run([tool("hadolint"), "--no-color", DOCKERFILE])
    assert result.returncode == 0, result.stdout + result.stderr


def _runtime_packages() -> list[str]:
    """The top-level packages of the runtime wheel (pyproject.toml's packages.find)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    include: list[str] = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return [name for name in include if "*" not in name]


def test_dockerignore_keeps_what_the_wheel_needs() -> None:
    """`pip wheel .` inside the build needs pyproject.toml, setup.py (the compiled core), the
    readme and every package: a new top-level package listed in pyproject.toml must not be
    ignored by .dockerignore."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = ["pyproject.toml", "setup.py", project["project"]["readme"], *_runtime_packages()]
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in needed:
        ignored = [p for p in patterns if fnmatch.fnmatch(path, p.removeprefix("**/"))]
        assert not ignored, f"{path} is excluded from the build context by {ignored}"
    for path in (".venv", ".git", "tests", "harness"):
        assert path in patterns, f"{path} should stay out of the build context"


def test_the_wheel_is_the_runtime_only() -> None:
    """The image's wheel holds protocol, proxy and config; the test harness (harness/: testbed,
    pipeline) is a distribution of its own that the image never installs."""
    assert sorted(_runtime_packages()) == ["config", "protocol", "proxy"]
    harness = tomllib.loads((REPO / "harness" / "pyproject.toml").read_text())
    packages = harness["tool"]["setuptools"]["packages"]
    assert sorted({name.partition(".")[0] for name in packages}) == ["pipeline", "testbed"]


def test_dockerfile_contract() -> None:
    """What the chart and docs/deploy.md rely on: uid, ports, stop signal, entrypoint, config path,
    and a base image that can be swapped."""
    text = DOCKERFILE.read_text()
    lines = [line.strip() for line in text.splitlines()]
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in lines
    assert lines.count("FROM ${BASE_IMAGE}") == 1
    assert "FROM ${BASE_IMAGE} AS build" in lines
    assert "USER 10001:10001" in lines
    assert "EXPOSE 61613 9464" in lines
    assert "STOPSIGNAL SIGTERM" in lines
    assert 'ENTRYPOINT ["mq-sidecar"]' in lines
    assert 'CMD ["run"]' in lines
    assert "MQ_SIDECAR_CONFIG=/etc/mq-sidecar/mq-sidecar.toml" in text
    assert "http://127.0.0.1:9464/healthz" in text
