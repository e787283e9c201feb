"""Build the container image and run it: podman build + buildah run, chroot isolation.

Where it runs: root, podman and buildah installed (scripts/get-tools.sh, Debian packages).
`podman run` does not work in this sandbox (setrlimit refused), so containers are run with
`buildah run --isolation chroot`, which shares the host's network: the daemon inside reaches
the test's ActiveMQ on 127.0.0.1, and the test reaches the daemon's ports.

Base image: no registry is reachable here, so the Dockerfile's default (python:3.11-slim)
cannot be pulled; scripts/build-base-image.sh builds localhost/mq-sidecar-base:bookworm with
debootstrap once (about 45 s) and podman keeps it, like the build's layer cache, so a warm run
costs a few seconds. DEPLOY_BASE_IMAGE=<image> uses another base already in podman's storage;
SKIP_IMAGE_BUILD=1 skips these tests.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import ActiveMQ, free_port, wait_stomp
from tests.deploy.support import (
    CONFIG_MOUNT,
    PRODUCTION_VALUES,
    REPO,
    clean_environ,
    config_toml,
    container_env,
    documents,
    pod_specs,
    project_version,
    render,
    run,
    sidecar,
)

IMAGE = "localhost/mq-sidecar:test"
DEFAULT_BASE = "localhost/mq-sidecar-base:bookworm"
#: The host's CA bundle, bind-mounted into the build for pip (TLS is intercepted here).
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def _missing() -> str | None:
    """What this machine lacks for the image build (None: nothing): a missing tool fails the
    test with the set-up step to run, it never skips (a skip hides a missing install step)."""
    missing = [t for t in ("podman", "buildah") if shutil.which(t) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not installed: scripts/get-tools.sh installs podman, "
            "buildah and debootstrap from Debian (as root)"
        )
    if os.geteuid() != 0:
        return "image builds here need root (rootful podman with chroot isolation)"
    return None


def _tail(result: subprocess.CompletedProcess[str], lines: int = 25) -> str:
    return "\n".join((result.stdout + result.stderr).splitlines()[-lines:])


@pytest.fixture(scope="module")
def image() -> str:
    """The image built from the repository's Dockerfile on the local base, tagged IMAGE."""
    if os.environ.get("SKIP_IMAGE_BUILD") == "1":
        pytest.skip("SKIP_IMAGE_BUILD=1: the image build was asked not to run")
    reason = _missing()
    if reason:
        pytest.fail(f"image build not possible: {reason}", pytrace=False)
    base = os.environ.get("DEPLOY_BASE_IMAGE", DEFAULT_BASE)
    if run(["podman", "image", "exists", base]).returncode != 0:
        if base != DEFAULT_BASE:
            pytest.fail(f"DEPLOY_BASE_IMAGE={base} is not in podman's storage")
        built = run(["bash", REPO / "scripts" / "build-base-image.sh"], timeout=900)
        if built.returncode != 0:
            pytest.fail(
                f"image build not possible: no local base image ({_tail(built, 5)})",
                pytrace=False,
            )
    # Can this machine execute RUN steps (chroot isolation) at all?
    probe = run(["buildah", "from", "--quiet", "--pull-never", base])
    if probe.returncode == 0:
        ctr = probe.stdout.strip()
        ran = run(["buildah", "run", "--isolation", "chroot", ctr, "--", "true"])
        run(["buildah", "rm", ctr])
        if ran.returncode != 0:
            pytest.fail(f"image build not possible: RUN steps fail here ({_tail(ran, 3)})")

    old = run(["podman", "image", "inspect", "--format", "{{.Id}}", IMAGE]).stdout.strip()
    cmd: list[str | Path] = [
        "podman", "build", "--isolation", "chroot", "--format", "docker", "--layers",
        "--build-arg", f"BASE_IMAGE={base}",
        "--build-arg", f"VERSION={project_version()}",
        "--tag", IMAGE,
    ]  # fmt: skip
    if HOST_CA.is_file():
        cmd += [
            "--volume", f"{HOST_CA}:/run/host-ca.crt:ro",
            "--build-arg", "PIP_CA_BUNDLE=/run/host-ca.crt",
        ]  # fmt: skip
    result = run([*cmd, REPO], timeout=900)
    assert result.returncode == 0, f"podman build failed:\n{_tail(result)}"
    new = run(["podman", "image", "inspect", "--format", "{{.Id}}", IMAGE]).stdout.strip()
    # Do not pile up images (one final image and one build-stage leaf per source change):
    # remove the previous final image and every build-stage leaf but the newest, which with
    # its parents (dependencies layer) is the cache of the next build.
    if old and old != new:
        run(["podman", "rmi", old])
    leaves = json.loads(
        run(["podman", "images", "--format", "json", "--filter", "dangling=true",
             "--filter", "label=io.mq-sidecar.stage=build"]).stdout or "[]"
    )  # fmt: skip
    leaves.sort(key=lambda image: image["Created"])
    if len(leaves) > 1:
        run(["podman", "rmi", *(image["Id"] for image in leaves[:-1])])
    return IMAGE


@pytest.fixture
def containers(image: str) -> Iterator[list[str]]:
    """Working containers of the image; append to the list, removed after the test."""
    made: list[str] = []
    yield made
    if made:
        run(["buildah", "rm", *made])


def new_container(image: str, made: list[str]) -> str:
    result = run(["buildah", "from", "--quiet", "--pull-never", image])
    assert result.returncode == 0, result.stderr
    ctr = result.stdout.strip()
    made.append(ctr)
    return ctr


def buildah_run(
    ctr: str, *command: str, env: dict[str, str] | None = None, volumes: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    args: list[str] = ["buildah", "run", "--isolation", "chroot"]
    for name, value in (env or {}).items():
        args += ["--env", f"{name}={value}"]
    for volume in volumes:
        args += ["--volume", volume]
    return run([*args, ctr, "--", *command], timeout=120)


def _healthcheck(info: dict[str, Any]) -> list[str]:
    """The HEALTHCHECK test command (podman 4 shows it beside Config, docker inside it)."""
    check = info.get("Healthcheck") or info["Config"].get("Healthcheck")
    assert check, "the image has no HEALTHCHECK (built with --format oci?)"
    test: list[str] = check["Test"]
    return test


def test_image_metadata_and_cli(image: str, containers: list[str], tmp_path: Path) -> None:
    info: dict[str, Any] = json.loads(run(["podman", "image", "inspect", image]).stdout)[0]
    config = info["Config"]
    assert config["User"] == "10001:10001"
    assert config["StopSignal"] == "SIGTERM"
    assert set(config["ExposedPorts"]) == {"61613/tcp", "9464/tcp"}
    assert config["Entrypoint"] == ["mq-sidecar"]
    assert config["Cmd"] == ["run"]
    assert _healthcheck(info)[0] == "CMD"
    assert "MQ_SIDECAR_CONFIG=/etc/mq-sidecar/mq-sidecar.toml" in config["Env"]
    assert config["Labels"]["org.opencontainers.image.version"] == project_version()
    assert "/run/host-ca.crt" not in json.dumps(info.get("Config", {}))

    ctr = new_container(image, containers)
    version = buildah_run(ctr, "mq-sidecar", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"mq-sidecar, version {project_version()}"
    assert buildah_run(ctr, "id", "-u").stdout.strip() == "10001"
    # The runtime venv has the program, not the build tools.
    assert buildah_run(ctr, "test", "-e", "/opt/mq-sidecar/bin/pip").returncode != 0
    # ... nor the test harness (harness/): its commands say in one line that it is missing.
    harness = buildah_run(ctr, "python3", "-c", "import testbed")
    assert harness.returncode != 0
    assert "No module named 'testbed'" in harness.stderr
    drill = buildah_run(ctr, "mq-sidecar", "drill")
    assert drill.returncode == 1
    said = [line for line in drill.stderr.splitlines() if line.startswith("mq-sidecar:")]
    assert len(said) == 1, drill.stderr  # (buildah adds lines of its own)
    assert "mq-sidecar-harness" in said[0]
    assert "Traceback" not in drill.stderr

    # The image's own (empty) config file plus environment variables.
    bare = buildah_run(ctr, "mq-sidecar", "check-config")
    assert bare.returncode == 2
    assert "no brokers configured" in bare.stderr
    env_only = buildah_run(
        ctr, "mq-sidecar", "check-config", env={"MQ_SIDECAR_BROKERS": "stomp://mq.svc:61613"}
    )
    assert env_only.returncode == 0, env_only.stderr

    # The chart's ConfigMap, mounted where the chart mounts it, with the sidecar's env.
    for values in ((), ("--values", str(PRODUCTION_VALUES))):
        docs = documents(render(*values))
        config_dir = tmp_path / f"config{len(values)}"
        config_dir.mkdir()
        (config_dir / "mq-sidecar.toml").write_text(config_toml(docs))
        _, spec = next(pod_specs(docs))
        container = sidecar(spec)
        result = buildah_run(
            ctr,
            "mq-sidecar",
            "check-config",
            *container["args"][1:],
            env=container_env(container, docs),
            volumes=(f"{config_dir}:{CONFIG_MOUNT}:ro",),
        )
        assert result.returncode == 0, f"{values}: {result.stderr}"
        assert "configuration OK" in result.stderr


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (chroot isolation: the container's processes are ours)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        todo += children
    return found


def _daemon_pid(buildah: subprocess.Popen[str]) -> int:
    """The python process running `mq-sidecar run` inside the container."""
    for pid in _descendants(buildah.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[0].endswith(b"python3") and b"/opt/mq-sidecar/bin/mq-sidecar" in cmdline:
            return pid
    raise AssertionError("mq-sidecar process not found under buildah run")


def _http_get(url: str, *, until: float) -> tuple[int, str]:
    """GET ``url``; retried on connection errors and 5xx until the monotonic deadline."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or time.monotonic() > until:
                return exc.code, exc.read().decode()
        except OSError:
            if time.monotonic() > until:
                raise
        time.sleep(0.1)


def test_image_runs_the_daemon(
    image: str, containers: list[str], activemq: ActiveMQ, tmp_path: Path
) -> None:
    """The image runs `mq-sidecar run` with the chart's config as uid 10001, relays a STOMP
    CONNECT to a real ActiveMQ, answers the probes and the HEALTHCHECK, drains on SIGTERM
    with exit status 0, and writes nothing to its root filesystem."""
    docs = documents(render())
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "mq-sidecar.toml").write_text(config_toml(docs))
    _, spec = next(pod_specs(docs))
    args = sidecar(spec)["args"]
    stomp, admin = free_port(), free_port()
    ctr = new_container(image, containers)
    env = {
        "MQ_SIDECAR_BROKERS": activemq.stomp_url,
        # The chart's listen addresses, on free ports (the container shares our network).
        "MQ_SIDECAR_LISTEN": f"127.0.0.1:{stomp}",
        "MQ_SIDECAR_ADMIN_LISTEN": f"127.0.0.1:{admin}",
    }
    command = ["buildah", "run", "--isolation", "chroot"]
    command += [f"--env={k}={v}" for k, v in env.items()]
    command += [f"--volume={config_dir}:{CONFIG_MOUNT}:ro", ctr, "--", "mq-sidecar", *args]
    # The open-file limit Kubernetes' runtimes give a container (containerd, CRI-O: 1048576),
    # or what this process may give, which the daemon needs for max_sessions (docs/deploy.md):
    # buildah run gives 1024.
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    containers_conf = tmp_path / "containers.conf"
    containers_conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}"]\n')
    daemon = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean_environ(), "CONTAINERS_CONF": str(containers_conf)},
        start_new_session=True,
    )
    try:
        try:
            wait_stomp("127.0.0.1", stomp, timeout=30)  # CONNECT -> sidecar -> ActiveMQ
        except TimeoutError:
            if daemon.poll() is None:
                raise
            stdout, stderr = daemon.communicate()
            pytest.fail(f"the daemon exited with {daemon.returncode}: {stderr}{stdout}")
        until = time.monotonic() + 30
        assert _http_get(f"http://127.0.0.1:{admin}/healthz", until=until)[0] == 200
        assert _http_get(f"http://127.0.0.1:{admin}/readyz", until=until)[0] == 200
        status, metrics = _http_get(f"http://127.0.0.1:{admin}/metrics", until=until)
        assert status == 200
        assert "# TYPE" in metrics

        # The image's HEALTHCHECK command, pointed at this run's admin port.
        info = json.loads(run(["podman", "image", "inspect", image]).stdout)[0]
        check = [a.replace(":9464/", f":{admin}/") for a in _healthcheck(info)[1:]]
        probe = buildah_run(new_container(image, containers), *check)
        assert probe.returncode == 0, probe.stderr

        pid = _daemon_pid(daemon)
        uid = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0]
        assert uid == "10001"
        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)  # what the kubelet sends (STOPSIGNAL)
        _, stderr = daemon.communicate(timeout=30)
        assert daemon.returncode == 0, stderr
        assert time.monotonic() - started < 10, "drain took longer than drain_timeout"
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
        if daemon.stdout is not None and not daemon.stdout.closed:
            daemon.communicate()  # reads and closes its pipes
    diff = run(["podman", "diff", ctr])
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.strip() == "", f"the daemon wrote to its root filesystem:\n{diff.stdout}"
