"""The ``mq-sidecar`` command as a user runs it: a real process, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import ActiveMQ, free_port, wait_stomp
from tests.integration.support import WAIT, RawClient, client, unique

MQ_SIDECAR = [sys.executable, "-m", "proxy"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MQ_SIDECAR, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert "mq-sidecar" in result.stdout


def test_help_lists_the_harness_commands_beside_the_daemons() -> None:
    """``demo`` and ``drill`` come from the harness distribution (entry points)."""
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.split("Commands:")[1].splitlines() if line}
    assert listed == {"run", "check-config", "demo", "drill"}


#: ``mq-sidecar ARGS`` as if the harness were not installed (no entry points of its group).
_WITHOUT_HARNESS = """
import importlib.metadata, sys
from proxy.__main__ import COMMAND_GROUP, main
real = importlib.metadata.entry_points
def entry_points(**params):
    if params.get("group") == COMMAND_GROUP:
        return importlib.metadata.EntryPoints(())
    return real(**params)
importlib.metadata.entry_points = entry_points
sys.argv[0] = "mq-sidecar"
main()
"""


@pytest.mark.parametrize("command", ["demo", "drill"])
def test_without_the_harness_its_commands_fail_in_one_line(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_HARNESS, command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"mq-sidecar: '{command}' comes with the test harness (mq-sidecar-harness, harness/ in "
        "the repository), which is not installed: run scripts/setup.sh"
    ]
    listed = subprocess.run(
        [sys.executable, "-c", _WITHOUT_HARNESS, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0
    assert command not in listed.stdout


def test_check_config_reports_every_problem_and_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('retry_interval = -5\nlisten = "nowhere"\nbogus_option = 1\n')
    result = run_cli("check-config", "--config", str(cfg), env={"MQ_SIDECAR_JITTER": "3"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) >= 4, result.stderr  # retry_interval, listen, bogus_option, jitter, brokers
    text = result.stderr
    for needle in ("retry_interval", "listen", "bogus_option", "jitter", "brokers"):
        assert needle in text
    assert "Traceback" not in text


def test_check_config_ok_hides_credentials() -> None:
    result = run_cli(
        "check-config",
        "--brokers",
        "failover:(stomp://user:topsecret@127.0.0.1:61613)?retryInterval=250",
    )
    assert result.returncode == 0, result.stderr
    assert "topsecret" not in result.stdout + result.stderr
    assert '"retry_interval": 250' in result.stdout


def test_run_relays_and_drains_on_sigterm(activemq: ActiveMQ, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "sidecar.log"
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            [
                *MQ_SIDECAR,
                "run",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                "127.0.0.1:0",
                "--brokers",
                activemq.stomp_url,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_stomp("127.0.0.1", port, timeout=WAIT)
        dest = unique()
        with client(("127.0.0.1", port)) as c:
            c.conn.subscribe(destination=dest, id="1", ack="auto", headers={"receipt": "s"})
            c.receipt("s")
            c.conn.send(dest, "through the process")
            assert c.expect("MESSAGE").body == "through the process"
        raw = RawClient(("127.0.0.1", port))
        raw.connect()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        frame = raw.frame()
        assert frame.command == "ERROR"
        assert "shutting down" in (frame.get("message") or "")
        assert raw.closed()
        assert proc.wait(timeout=WAIT) == 0
        assert time.monotonic() - started < WAIT
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "shutdown complete" in text
    assert "Traceback" not in text


def test_run_exits_1_with_a_reason_when_the_port_is_taken(activemq: ActiveMQ) -> None:
    result = run_cli(
        "run", "--listen", f"127.0.0.1:{activemq.stomp_port}", "--brokers", activemq.stomp_url
    )
    assert result.returncode == 1
    assert "cannot listen on" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.activemq
def test_demo_starts_a_broker_and_the_sidecar(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            *MQ_SIDECAR,
            "demo",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            "127.0.0.1:0",
            "--workdir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_stomp("127.0.0.1", port, timeout=60)
        dest = unique()
        with client(("127.0.0.1", port)) as c:
            c.conn.subscribe(destination=dest, id="1", ack="auto", headers={"receipt": "s"})
            c.receipt("s")
            c.conn.send(dest, "demo works")
            assert c.expect("MESSAGE").body == "demo works"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert f"127.0.0.1:{port}" in out
        assert "import stomp" in out  # it tells the user how to connect
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # the broker it started is gone too
    java = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert java.stdout.strip() == ""


def test_unusable_tls_files_end_the_start_with_one_line_each(tmp_path: Path) -> None:
    """A typo in a TLS path ends the start with the option and the file named, not a
    tls_error at every connect (the files are read again at every connect later);
    check-config does not open them (they may exist only in the sidecar's container)."""
    missing = tmp_path / "no-such-ca.pem"
    checked = run_cli(
        "check-config",
        "--brokers",
        "stomp+ssl://127.0.0.1:61614",
        env={"MQ_SIDECAR_TLS_CA_FILE": str(missing)},
    )
    assert checked.returncode == 0, checked
    result = run_cli(
        "run",
        "--brokers",
        "stomp+ssl://127.0.0.1:61614",
        env={"MQ_SIDECAR_TLS_CA_FILE": str(missing)},
    )
    assert result.returncode == 1, result
    assert f"mq-sidecar: TLS: tls_ca_file {missing}: no such file\n" in result.stderr
    assert "Traceback" not in result.stderr
