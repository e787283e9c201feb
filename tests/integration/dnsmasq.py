"""A real DNS server for the tests: dnsmasq (Debian's package) in the foreground on a free
127.0.0.1 port, answering only for the records the test gives it (no upstream servers, no
/etc/hosts), its PID known and stopped by it.

Records: SRV records (``--srv-host``) and host records (``--host-record``, A only), written to a
configuration file the test rewrites. dnsmasq reads that file at start only (a SIGHUP re-reads
hosts files, not options), so :meth:`Dnsmasq.set_records` restarts it on the same port: the
sidecar's lookups during the gap fail, and it keeps its last good answer. Names with several
addresses go in a hosts file (``--addn-hosts``) that :meth:`Dnsmasq.set_addresses` rewrites and
SIGHUP reloads. Addresses are 127.0.0.x only.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["Dnsmasq", "dnsmasq_server"]

DNSMASQ = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"


def _free_udp_and_tcp_port() -> int:
    """A port free on 127.0.0.1 for both UDP and TCP (dnsmasq listens on both), at most 50
    tries."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port = int(udp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no port free for both UDP and TCP on 127.0.0.1")


class Dnsmasq:
    """One dnsmasq process; see the module docstring.

    Args:
        workdir: where its configuration and log go.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _free_udp_and_tcp_port()
        self.conf = workdir / "dnsmasq.conf"
        self.log = workdir / "dnsmasq.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.srv: dict[str, list[tuple[str, int]]] = {}
        self.hosts: dict[str, str] = {}
        #: Names with their addresses in a hosts file (``--addn-hosts``): SIGHUP reloads it.
        self.addresses: dict[str, list[str]] = {}
        self.hosts_file = workdir / "dnsmasq.hosts"

    @property
    def server(self) -> str:
        """``127.0.0.1:port``, as ``dns_servers`` takes it."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _write(self) -> None:
        lines = [f"host-record={name},{address}" for name, address in self.hosts.items()]
        for name, targets in self.srv.items():
            lines += [
                f"srv-host={name},{host},{port},0,{100 - k}"
                for k, (host, port) in enumerate(targets)
            ]
        self.conf.write_text("\n".join(lines) + "\n")
        self._write_hosts()

    def _write_hosts(self) -> None:
        assert all(a.startswith("127.0.0.") for v in self.addresses.values() for a in v)
        self.hosts_file.write_text(
            "".join(
                f"{a} {name}\n" for name, addresses in self.addresses.items() for a in addresses
            )
        )

    def set_addresses(self, addresses: dict[str, list[str]]) -> None:
        """Replace the hosts file's names and addresses and SIGHUP dnsmasq (by its PID) to
        read it again."""
        self.addresses = {k: list(v) for k, v in addresses.items()}
        self._write_hosts()
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGHUP)

    def start(self) -> None:
        """Start it and wait until it answers (at most 5 s)."""
        assert self._proc is None
        self._write()
        command = [
            DNSMASQ,
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--no-poll",
            "--bind-interfaces",
            "--listen-address=127.0.0.1",
            f"--port={self.port}",
            f"--conf-file={self.conf}",
            f"--addn-hosts={self.hosts_file}",
            f"--user={getpass.getuser()}",
            "--pid-file=",
            "--log-facility=-",
            "--log-queries",
        ]
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # bounded: 5 s of 20 ms polls
            if self._proc.poll() is not None:
                raise RuntimeError(f"dnsmasq exited: {self.log.read_text()[-2000:]}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError("dnsmasq did not listen within 5 s")

    def stop(self) -> None:
        """SIGTERM by its PID, then SIGKILL after 5 s; reaped. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def set_records(
        self, *, srv: dict[str, Sequence[tuple[str, int]]] | None = None, restart: bool = True
    ) -> None:
        """Replace the SRV records (name -> [(target, port)], first = highest priority
        weight); with ``restart``, stop and start it on the same port to serve them."""
        if srv is not None:
            self.srv = {k: list(v) for k, v in srv.items()}
        if restart:
            self.stop()
            self.start()


@contextmanager
def dnsmasq_server(workdir: Path, hosts: dict[str, str]) -> Iterator[Dnsmasq]:
    """A :class:`Dnsmasq` with ``hosts`` (name -> 127.0.0.x), not started; stopped at the end.
    Fails the test when dnsmasq is not installed (scripts/setup.sh installs it), as the
    broker fixtures do: a missing install step must not pass as a skipped test."""
    if not os.path.exists(DNSMASQ):
        pytest.fail("dnsmasq is not installed: run scripts/setup.sh", pytrace=False)
    assert all(a.startswith("127.0.0.") for a in hosts.values())
    server = Dnsmasq(workdir)
    server.hosts = dict(hosts)
    try:
        yield server
    finally:
        server.stop()
