"""RabbitMQ 3.10 with rabbitmq_stomp (Debian package ``rabbitmq-server``) as a test broker.

Facts in docs/brokers.md, "Running them for tests":

* ``/usr/lib/rabbitmq/bin/rabbitmq-server`` is run directly (``/usr/sbin/rabbitmq-server``
  switches user and logs to /var/log). It is an ``sh`` wrapper that traps SIGTERM, TERMs
  beam.smp and waits for it: the Popen child is the wrapper, beam.smp its only child. So
  ``pid`` (crash, hang) is beam.smp, while ``stop()`` signals the wrapper (orderly, ~1 s).
* Each node owns a private epmd (foreground child on ``epmd_port``, started before the node
  and killed at ``stop()``); the node would otherwise start ``epmd -daemon`` which outlives
  everything. Everything listens on 127.0.0.1 only, Erlang distribution included.
* ``HOME`` is ``workdir/NAME/home``: the Erlang cookie is ``$HOME/.erlang.cookie``, shared by
  the server and ``rabbitmqctl()``. Node name ``NAME@localhost``.
* A cluster member (``testbed.rabbitmq_cluster``) is built with ``shared_epmd=True``, the
  cluster's epmd port and its ``cookie``: it neither starts nor stops an epmd, refuses to start
  when none listens there, and its server and CLI run with ``ERL_FLAGS=-start_epmd false``,
  since a ``rabbitmqctl`` run while no epmd listens on ``ERL_EPMD_PORT`` starts an
  ``epmd -daemon`` on that port that outlives everything (measured with 3.10.8 / OTP 25).
* STOMP: default user guest/guest for CONNECTs without login; the CONNECT ``host`` header is
  the vhost, so use ``vhost`` ("/").
* TLS (``tls=``, a ``testbed.tls.TlsListener``): ``stomp.listeners.ssl.1`` on ``tls_port`` with
  the node's ``ssl_options`` (PEM files read directly; ``verify_peer`` and
  ``fail_if_no_peer_cert`` per ``require_client_cert`` when a client CA is given).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import string
import subprocess
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from testbed.broker import BrokerError, BrokerProcess, _Child, live_processes, proc_stat
from testbed.probe import free_port
from testbed.tls import TlsListener

__all__ = ["RABBITMQ_SBIN", "RabbitMQ", "rabbitmq_installed"]

#: Scripts of the Debian package that do not switch user (``rabbitmq-server``, ``rabbitmqctl``).
RABBITMQ_SBIN = Path("/usr/lib/rabbitmq/bin")


def _epmd() -> str | None:
    found = shutil.which("epmd")
    if found is None:  # Debian's erlang-base links /usr/bin/epmd; fall back to the ERTS copy
        copies = sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))
        found = str(copies[-1]) if copies else None
    return found


def rabbitmq_installed() -> bool:
    """True if the Debian ``rabbitmq-server`` package (with rabbitmq_stomp) and epmd exist."""
    server = RABBITMQ_SBIN / "rabbitmq-server"
    stomp_plugin = any(RABBITMQ_SBIN.parent.glob("lib/rabbitmq_server-*/plugins/rabbitmq_stomp-*"))
    return server.exists() and stomp_plugin and _epmd() is not None


class RabbitMQ(BrokerProcess):
    """One independent RabbitMQ node with the STOMP plugin, on 127.0.0.1 ports.

    Ports (default: free ports): ``stomp_port`` STOMP listener, ``amqp_port`` AMQP 0-9-1
    listener, ``dist_port`` Erlang distribution listener of the node, ``epmd_port`` the
    private epmd, ``tls_port`` the TLS STOMP listener (only with ``tls``, a ``TlsListener``;
    see ``stomp_ssl_url``). Start to STOMP-ready takes ~5 s (docs/brokers.md), an orderly stop
    ~1 s.

    ``conf``: more ``rabbitmq.conf`` lines (``stomp.implicit_connect = true``...).

    ``shared_epmd``: the node uses an epmd that someone else runs on ``epmd_port`` (a
    ``RabbitMQCluster``'s) instead of starting its own; ``start()`` raises ``BrokerError`` if
    nothing listens there. ``cookie``: the Erlang cookie to write (default: a random one), the
    same for every member of a cluster.
    """

    vhost = "/"

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        stomp_port: int | None = None,
        amqp_port: int | None = None,
        dist_port: int | None = None,
        epmd_port: int | None = None,
        tls: TlsListener | None = None,
        tls_port: int | None = None,
        shared_epmd: bool = False,
        cookie: str | None = None,
        conf: Sequence[str] = (),
    ) -> None:
        given = (stomp_port, amqp_port, dist_port, epmd_port, tls_port)
        taken = {p for p in given if p is not None}

        def pick(port: int | None) -> int:
            # Free ports for the unspecified ones, distinct from each other and the given ones.
            while port is None:
                port = free_port()
                if port in taken:
                    port = None
            taken.add(port)
            return port

        super().__init__(name, workdir, stomp_port=pick(stomp_port))
        self.amqp_port = pick(amqp_port)
        self.dist_port = pick(dist_port)
        self.epmd_port = pick(epmd_port)
        self.tls = tls
        if tls is not None:
            self.tls_port = pick(tls_port)
        self.node = f"{name}@localhost"
        self.home = self.base_dir / "home"
        self.shared_epmd = shared_epmd
        self.cookie = cookie
        self.conf = tuple(conf)
        self._epmd_child: _Child | None = None
        self._beam: tuple[int, int] | None = None  # (pid, starttime) of beam.smp

    @property
    def stomp_url(self) -> str:
        """``stomp://HOST:PORT?host=/``: RabbitMQ needs the vhost as CONNECT ``host``."""
        return f"stomp://{self.host}:{self.stomp_port}?host={self.vhost}"

    @property
    def stomp_ssl_url(self) -> str:
        """``stomp+ssl://HOST:PORT?host=/`` of the TLS STOMP listener (``tls=`` given)."""
        return f"{super().stomp_ssl_url}?host={self.vhost}"

    # -- environment --------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Environment for this node's server and CLI tools (``rabbitmqctl`` etc.)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RABBITMQ_", "ERL_")) and k not in ("NOTIFY_SOCKET", "HOME")
        }
        base = self.base_dir
        env.update(
            HOME=str(self.home),
            LC_ALL="C.UTF-8",
            LANG="C.UTF-8",
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            # Without it the distribution listener binds 0.0.0.0 (gotcha 8.12).
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            # rabbitmqctl & co. listen on an ephemeral port, not the fixed 35672-35682 range.
            RABBITMQ_CTL_DIST_PORT_MIN="0",
            RABBITMQ_CTL_DIST_PORT_MAX="0",
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_PID_FILE=str(base / "rabbit.pid"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(base / "advanced.config"),
            # Empty file: do not source /etc/rabbitmq/rabbitmq-env.conf.
            RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),
        )
        if self.shared_epmd:
            # Never an `epmd -daemon` of our own: with the shared epmd gone, fail instead.
            env["ERL_FLAGS"] = "-start_epmd false"
        return env

    def _server_env(self) -> dict[str, str]:
        return self.env()

    def _prepare(self) -> None:
        files = resources.files("testbed") / "files"
        for d in (self.home, self.base_dir / "mnesia", self.base_dir / "log"):
            d.mkdir(parents=True, exist_ok=True)
        template = string.Template((files / "rabbitmq.conf").read_text())
        conf = template.substitute(
            amqp_port=self.amqp_port,
            stomp_port=self.stomp_port,
            extra="\n".join([self._tls_conf(), *self.conf]),
        )
        (self.base_dir / "rabbitmq.conf").write_text(conf)
        (self.base_dir / "enabled_plugins").write_bytes((files / "enabled_plugins").read_bytes())
        (self.base_dir / "rabbitmq-env.conf").write_text("")
        cookie = self.home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(self.cookie or secrets.token_hex(16).upper())
            cookie.chmod(0o400)

    def _tls_conf(self) -> str:
        """The rabbitmq.conf lines of the TLS STOMP listener ("" without ``tls``)."""
        tls = self.tls
        if tls is None:
            return ""
        for path in (tls.cert_chain, tls.key, tls.client_ca):
            if path is not None and not Path(path).is_file():
                raise BrokerError(f"{self.name}: TLS file {path} does not exist")
        lines = [
            f"stomp.listeners.ssl.1 = 127.0.0.1:{self.tls_port}",
            f"ssl_options.certfile = {Path(tls.cert_chain).absolute()}",
            f"ssl_options.keyfile = {Path(tls.key).absolute()}",
        ]
        if tls.client_ca is None:
            lines.append("ssl_options.verify = verify_none")
        else:
            lines += [
                f"ssl_options.cacertfile = {Path(tls.client_ca).absolute()}",
                "ssl_options.verify = verify_peer",
                f"ssl_options.fail_if_no_peer_cert = {str(tls.require_client_cert).lower()}",
            ]
        return "\n".join(lines)

    # -- epmd ---------------------------------------------------------------------------

    def _epmd_running(self) -> bool:
        child = self._epmd_child
        return child is not None and child in self._children.items and child.popen.poll() is None

    def _before_server(self) -> None:
        if self.shared_epmd:
            try:
                socket.create_connection(("127.0.0.1", self.epmd_port), timeout=1.0).close()
            except OSError as exc:
                raise BrokerError(
                    f"{self.name}: no epmd listens on the shared port {self.epmd_port}: {exc}"
                ) from None
            return
        if self._epmd_running():
            return
        epmd = _epmd()
        if epmd is None:
            raise BrokerError("epmd not found (package erlang-base); run scripts/setup.sh")
        child = self._spawn(
            "epmd", [epmd, "-port", str(self.epmd_port), "-address", "127.0.0.1"], self.env()
        )
        self._epmd_child = child
        deadline = time.monotonic() + 10.0
        while True:
            if child.popen.poll() is not None:
                raise BrokerError(
                    f"{self.name}: epmd on port {self.epmd_port} exited with code "
                    f"{child.popen.returncode}\n{self._tail()}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.epmd_port), timeout=1.0).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"{self.name}: epmd did not listen on {self.epmd_port}\n{self._tail()}"
                    ) from None
                time.sleep(0.01)

    # -- server -------------------------------------------------------------------------

    def _server_command(self) -> list[str]:
        self._beam = None
        return [str(RABBITMQ_SBIN / "rabbitmq-server")]

    def _find_beam(self) -> tuple[int, int] | None:
        if not self.running() or self._server is None:
            return None
        if self._beam is not None:
            st = proc_stat(self._beam[0])
            if st is not None and st.state != "Z" and st.starttime == self._beam[1]:
                return self._beam
            self._beam = None
        for st in live_processes(ppid=self._server.popen.pid):
            if st.comm == "beam.smp":
                self._beam = (st.pid, st.starttime)
                return self._beam
        return None

    def _broker_pid(self) -> int | None:
        found = self._find_beam()
        if found is None and self.running():
            # The wrapper forks `erl`, which execs erlexec, which execs beam.smp: give it a
            # moment when asked right after start().
            deadline = time.monotonic() + 5.0
            while found is None and self.running() and time.monotonic() < deadline:
                time.sleep(0.01)
                found = self._find_beam()
        return found[0] if found else None

    def _on_ready(self) -> None:
        self._find_beam()

    def rabbitmqctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n NODE ARGS...`` against this node; return its stdout.

        ``timeout`` is in seconds. Raises ``BrokerError`` with the output on a non-zero exit.
        """
        return self.cli("rabbitmqctl", *args, timeout=timeout)

    def cli(self, tool: str, *args: str, timeout: float = 60.0) -> str:
        """Run the package's CLI ``tool`` (``rabbitmqctl``, ``rabbitmq-queues``,
        ``rabbitmq-diagnostics``...) as ``TOOL -n NODE ARGS...`` with this node's environment
        (cookie, epmd port); return its stdout.

        ``timeout`` is in seconds (``subprocess.TimeoutExpired`` past it). Raises
        ``BrokerError`` with the output on a non-zero exit.
        """
        proc = subprocess.run(
            [str(RABBITMQ_SBIN / tool), "-n", self.node, *args],
            env=self.env(),
            cwd=self.base_dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise BrokerError(
                f"{tool} {' '.join(args)} on {self.node} failed with code "
                f"{proc.returncode}:\n{proc.stdout}{proc.stderr}"
            )
        return proc.stdout
