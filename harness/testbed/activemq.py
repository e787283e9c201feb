"""ActiveMQ Classic 5.17 (Debian package ``activemq``) as a foreground test broker.

The JVM is launched directly (``java ... -jar activemq.jar start xbean:file:...``), so the
Popen child *is* the broker: no ``/usr/bin/activemq`` (it switches user and daemonizes,
docs/brokers.md, "Running them for tests"). Configuration: ``testbed/files/activemq.xml`` and
``log4j.properties``, copied into ``workdir/NAME/conf`` and driven by ``-D`` properties.

Two instances given the same ``store_dir`` form a shared-store primary/backup pair: the
second one blocks on the kahaDB file lock ("slave mode", no listener at all) until the first
dies, then takes over (0.4-0.6 s after kill -9 with a 200 ms lock poll, docs/brokers.md).
A suspended (SIGSTOP) primary keeps the lock: the backup never takes over (gotcha 8.15).

With ``tls=`` (a ``testbed.tls.TlsListener``) the broker also has a ``stomp+ssl`` transport
connector on ``tls_port``; at start the PEM files become PKCS12 stores in ``conf/``: the key
store (server chain and key) with ``openssl pkcs12 -export``, the trust store (the client CA)
with ``keytool -importcert`` (Java reads only keytool's trusted-certificate entries).

With ``auth=`` (user name -> password) the broker checks logins with ActiveMQ's
``simpleAuthenticationPlugin`` (no anonymous access): a STOMP CONNECT with another login or a
wrong passcode is answered with an ERROR (``User name [x] or password is invalid.``) and the
connection closed. The readiness probe logs in as the first user. Change ``auth`` and
``start()`` again (after ``kill()`` or ``stop()``) to restart the broker with other users.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from xml.sax.saxutils import quoteattr

from testbed.broker import BrokerError, BrokerProcess, BrokerTimeout
from testbed.probe import free_port
from testbed.tls import TlsListener

__all__ = ["ACTIVEMQ_HOME", "ActiveMQ", "activemq_installed", "start_activemq_pair"]

#: Installation directory of the Debian package (``bin/activemq.jar``, ``lib/*.jar``).
ACTIVEMQ_HOME = Path("/usr/share/activemq")

#: JVM module flags that ``/usr/bin/activemq`` (Debian, 5.17.2) passes on Java > 8.
JVM_MODULE_FLAGS: tuple[str, ...] = (
    "--add-reads=java.xml=java.logging",
    "--add-opens=java.base/java.security=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.naming/javax.naming.spi=ALL-UNNAMED",
    "--add-opens=java.rmi/sun.rmi.transport.tcp=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.www.protocol.http=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.www.protocol.https=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.www.protocol.jar=ALL-UNNAMED",
    "--add-exports=jdk.xml.dom/org.w3c.dom.html=ALL-UNNAMED",
    "--add-exports=jdk.naming.rmi/com.sun.jndi.url.rmi=ALL-UNNAMED",
)

#: Log line of a broker blocked on a shared store's lock (kahaDB SharedFileLocker, INFO).
_BACKUP_WAITING = "is now in slave mode waiting a lock to be acquired"
#: Log line of a broker that finished starting ("Apache ActiveMQ 5.17.2 (NAME, ID:...) started").
_STARTED_RE = re.compile(r"^.*BrokerService - Apache ActiveMQ \S+ \(.*\) started\s*$", re.M)

#: Password of the PKCS12 key and trust stores made for a TLS listener (test files only; in
#: PKCS12 the key's password is the store's).
TLS_STORE_PASSWORD = "testbed"

#: Environment variables whose JVM options would change the broker (and keytool).
_JAVA_OPTION_VARS = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")

#: One certificate of a PEM file (keytool -importcert imports only the first of a bundle).
_PEM_CERT_RE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.+?-----END CERTIFICATE-----", re.DOTALL
)


def _java() -> str | None:
    return shutil.which("java")


def _keytool(java: str) -> str:
    """``keytool`` of the JDK that runs the broker (beside ``java``), else the one on PATH."""
    beside = Path(java).resolve().parent / "keytool"
    if beside.is_file():
        return str(beside)
    return shutil.which("keytool") or "keytool"


def _run_tool(command: list[str], what: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _JAVA_OPTION_VARS}
    try:
        proc = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(f"cannot make the {what}: {command[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise BrokerError(
            f"cannot make the {what}: {command[0]} exited with code {proc.returncode}:\n"
            f"{proc.stdout}{proc.stderr}"
        )


def activemq_installed() -> bool:
    """True if the Debian ``activemq`` package and a ``java`` on PATH are present."""
    return (ACTIVEMQ_HOME / "bin" / "activemq.jar").is_file() and _java() is not None


class ActiveMQ(BrokerProcess):
    """One ActiveMQ Classic broker with a STOMP listener (and optionally a TLS one) on 127.0.0.1.

    Arguments: ``stomp_port`` (default: a free port); ``store_dir`` the kahaDB directory
    (default ``workdir/NAME/kahadb``; pass the same directory to two instances for a
    shared-store pair); ``heap_mb`` JVM heap, MiB (-Xms = -Xmx; 256 MiB gives ~100 MiB RSS
    idle); ``lock_sleep_ms`` kahaDB ``lockAcquireSleepInterval``, ms (the backup's lock poll;
    ActiveMQ's default is 10 000); ``persist_redelivered`` sets ``persistJMSRedelivered`` so
    unacked messages come back with ``redelivered:true`` after a crash; ``memory_mb`` the
    ``memoryUsage`` limit, MiB, at which producer flow control silently blocks SENDs
    (gotcha 8.4); ``quick_jit`` runs the C1 JIT only (``-XX:TieredStopAtLevel=1``: ready in
    ~0.65 s instead of ~0.8 s here; pass ``False`` for long throughput benchmarks); ``java``
    the java executable (default: ``java`` on PATH); ``tls`` a ``TlsListener``: adds a
    ``stomp+ssl`` transport connector on ``tls_port`` (default: a free port), with
    ``transport.needClientAuth=true`` when ``tls.require_client_cert``, else
    ``transport.wantClientAuth=true`` when ``tls.client_ca`` is given; ``stomp_ssl_url``;
    ``auth`` the users (name -> password) the broker lets log in, with
    ``simpleAuthenticationPlugin``; None (the default): no login checked.

    No JMX, no advisories, no scheduler, no web console; persistent; STOMP only (no
    OpenWire, no ``stomp+nio``).
    """

    #: ActiveMQ ignores the CONNECT host header; any value works.
    vhost = "localhost"

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        stomp_port: int | None = None,
        store_dir: Path | None = None,
        heap_mb: int = 256,
        lock_sleep_ms: int = 200,
        persist_redelivered: bool = False,
        memory_mb: int = 64,
        quick_jit: bool = True,
        java: str | None = None,
        tls: TlsListener | None = None,
        tls_port: int | None = None,
        auth: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name, workdir, stomp_port=stomp_port or free_port())
        self.tls = tls
        self.auth = auth
        if tls is not None:
            while tls_port is None or tls_port == self.stomp_port:
                tls_port = free_port()
            self.tls_port = tls_port
        self.store_dir = Path(store_dir).absolute() if store_dir else self.base_dir / "kahadb"
        self.heap_mb = heap_mb
        self.lock_sleep_ms = lock_sleep_ms
        self.persist_redelivered = persist_redelivered
        self.memory_mb = memory_mb
        self.quick_jit = quick_jit
        self.java = java or _java() or "java"
        self.conf_dir = self.base_dir / "conf"
        self.data_dir = self.base_dir / "data"

    def _prepare(self) -> None:
        files = resources.files("testbed") / "files"
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "log4j.properties").write_bytes((files / "log4j.properties").read_bytes())
        xml = (files / "activemq.xml").read_text()
        if self.tls is not None:
            xml = self._with_tls(xml, self.tls)
        self.login, self.passcode = None, None
        if self.auth is not None:
            xml = _fill_marker(xml, "plugins", _simple_authentication(self.auth))
            self.login, self.passcode = next(iter(self.auth.items()), (None, None))
        (self.conf_dir / "activemq.xml").write_text(xml)
        for d in (self.data_dir, self.base_dir / "tmp", self.store_dir):
            d.mkdir(parents=True, exist_ok=True)

    def _with_tls(self, xml: str, tls: TlsListener) -> str:
        """``xml`` with the sslContext and the stomp+ssl connector in place of their markers;
        makes the stores they name."""
        keystore, truststore = self._make_stores(tls)
        password = quoteattr(TLS_STORE_PASSWORD)
        context = (
            f"<sslContext><sslContext keyStore={quoteattr(keystore.as_uri())} "
            f'keyStorePassword={password} keyStoreType="PKCS12"'
        )
        if truststore is not None:
            context += (
                f" trustStore={quoteattr(truststore.as_uri())} "
                f'trustStorePassword={password} trustStoreType="PKCS12"'
            )
        context += "/></sslContext>"
        uri = f"stomp+ssl://127.0.0.1:{self.tls_port}"
        if tls.require_client_cert:
            uri += "?transport.needClientAuth=true"
        elif tls.client_ca is not None:
            uri += "?transport.wantClientAuth=true"
        connector = f'<transportConnector name="stomp+ssl" uri={quoteattr(uri)}/>'
        xml = _fill_marker(xml, "sslContext", context)
        return _fill_marker(xml, "stomp+ssl", connector)

    def _make_stores(self, tls: TlsListener) -> tuple[Path, Path | None]:
        """Make ``conf/tls-keystore.p12`` and (with a client CA) ``conf/tls-truststore.p12``
        from the PEM files; kept from the last start while the PEM files are unchanged."""
        keystore = self.conf_dir / "tls-keystore.p12"
        truststore = self.conf_dir / "tls-truststore.p12" if tls.client_ca else None
        stamp = self.conf_dir / "tls-stores.sha256"
        digest = hashlib.sha256()
        for path in (tls.cert_chain, tls.key, tls.client_ca):
            digest.update(b"\0" if path is None else Path(path).read_bytes() + b"\0\0")
        fresh = digest.hexdigest()
        wanted = [p for p in (keystore, truststore) if p is not None]
        if stamp.exists() and stamp.read_text() == fresh and all(p.exists() for p in wanted):
            return keystore, truststore
        stamp.unlink(missing_ok=True)
        for path in (keystore, self.conf_dir / "tls-truststore.p12"):
            path.unlink(missing_ok=True)
        _run_tool(
            [
                shutil.which("openssl") or "openssl",
                "pkcs12",
                "-export",
                "-in",
                str(tls.cert_chain),
                "-inkey",
                str(tls.key),
                "-name",
                "broker",
                "-out",
                str(keystore),
                "-passout",
                f"pass:{TLS_STORE_PASSWORD}",
            ],
            f"key store {keystore} of {self.name}",
        )
        if truststore is not None and tls.client_ca is not None:
            certs = _PEM_CERT_RE.findall(Path(tls.client_ca).read_bytes())
            if not certs:
                raise BrokerError(f"{tls.client_ca}: no PEM certificate in the client CA file")
            for n, cert in enumerate(certs):
                one = self.conf_dir / f"tls-client-ca-{n}.pem"
                one.write_bytes(cert + b"\n")
                _run_tool(
                    [
                        _keytool(self.java),
                        "-importcert",
                        "-noprompt",
                        "-alias",
                        f"client-ca-{n}",
                        "-file",
                        str(one),
                        "-keystore",
                        str(truststore),
                        "-storetype",
                        "PKCS12",
                        "-storepass",
                        TLS_STORE_PASSWORD,
                    ],
                    f"trust store {truststore} of {self.name}",
                )
        stamp.write_text(fresh)
        return keystore, truststore

    def _server_command(self) -> list[str]:
        props = {
            # Read by activemq.jar's launcher (org.apache.activemq.console.Main).
            "activemq.classpath": f"{self.conf_dir}:{ACTIVEMQ_HOME}/lib/",
            "activemq.home": str(ACTIVEMQ_HOME),
            "activemq.base": str(self.base_dir),
            "activemq.conf": str(self.conf_dir),
            "activemq.data": str(self.data_dir),
            "java.io.tmpdir": str(self.base_dir / "tmp"),
            "java.awt.headless": "true",
            # A plain IPv4 listener socket (not [::ffff:127.0.0.1] on an IPv6 socket).
            "java.net.preferIPv4Stack": "true",
            # Read by files/activemq.xml.
            "broker.name": self.name,
            "stomp.port": str(self.stomp_port),
            "kahadb.dir": str(self.store_dir),
            "lock.sleep.ms": str(self.lock_sleep_ms),
            "persist.redelivered": "true" if self.persist_redelivered else "false",
            "memory.mb": str(self.memory_mb),
        }
        return [
            self.java,
            f"-Xms{self.heap_mb}m",
            f"-Xmx{self.heap_mb}m",
            # SerialGC: smaller and faster to start on 2 cores (docs/brokers.md). No perf
            # data: nothing left in /tmp/hsperfdata_USER after a kill -9.
            "-XX:+UseSerialGC",
            "-XX:-UsePerfData",
            *(["-XX:TieredStopAtLevel=1"] if self.quick_jit else []),
            *JVM_MODULE_FLAGS,
            *(f"-D{key}={value}" for key, value in props.items()),
            "-jar",
            str(ACTIVEMQ_HOME / "bin" / "activemq.jar"),
            "start",
            f"xbean:file:{self.conf_dir / 'activemq.xml'}?validate=false",
        ]

    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACTIVEMQ_")}
        # Keep stray JVM option variables from changing the broker (and its log).
        for var in _JAVA_OPTION_VARS:
            env.pop(var, None)
        return env

    def is_backup_waiting(self) -> bool:
        """True while this broker runs blocked on the shared store's lock (not serving).

        Read from the current run's log: the SharedFileLocker's "slave mode" line is there
        and the "started" line is not yet.
        """
        if not self.running():
            return False
        log = self._log_since_start()
        return _BACKUP_WAITING in log and not _STARTED_RE.search(log)

    def is_started(self) -> bool:
        """True once the current run's log says the broker started (listeners open)."""
        return self.running() and bool(_STARTED_RE.search(self._log_since_start()))

    def wait_backup(self, timeout: float = 30.0) -> float:
        """Wait until this broker is blocked as a backup on the shared store's lock.

        ``timeout`` in seconds; returns the seconds waited. Raises ``BrokerError`` if the
        process exits or starts serving instead (the store was not locked by a primary), and
        ``BrokerTimeout`` after ``timeout``.
        """
        started = time.monotonic()
        while not self.is_backup_waiting():
            if not self.running():
                raise BrokerError(f"{self.name} exited before waiting as a backup\n{self._tail()}")
            if self.is_started():
                raise BrokerError(
                    f"{self.name} started serving instead of waiting as a backup: is the "
                    f"primary on {self.store_dir} running?\n{self._tail()}"
                )
            if time.monotonic() - started > timeout:
                raise BrokerTimeout(
                    f"{self.name} did not reach backup mode within {timeout:.1f} s\n{self._tail()}"
                )
            time.sleep(0.01)
        return time.monotonic() - started


def _fill_marker(xml: str, marker: str, element: str) -> str:
    """``xml`` with the comment ``<!-- testbed:MARKER -->`` replaced by ``element``."""
    tag = f"<!-- testbed:{marker} -->"
    if tag not in xml:
        raise BrokerError(f"activemq.xml lacks the marker {tag}")
    return xml.replace(tag, element)


def _simple_authentication(users: Mapping[str, str]) -> str:
    """The ``<plugins>`` element that lets exactly ``users`` (name -> password) log in
    (ActiveMQ "Security": simpleAuthenticationPlugin; no authorization map, so a logged-in
    user may use every destination)."""
    entries = "".join(
        f"<authenticationUser username={quoteattr(user)} password={quoteattr(password)} "
        'groups="users"/>'
        for user, password in users.items()
    )
    return (
        '<plugins><simpleAuthenticationPlugin anonymousAccessAllowed="false">'
        f"<users>{entries}</users></simpleAuthenticationPlugin></plugins>"
    )


def start_activemq_pair(
    workdir: Path,
    *,
    name: str = "amq",
    heap_mb: int = 256,
    lock_sleep_ms: int = 200,
    persist_redelivered: bool = False,
    memory_mb: int = 64,
    timeout: float = 60.0,
    tls: TlsListener | None = None,
) -> tuple[ActiveMQ, ActiveMQ]:
    """Start a shared-store pair in ``workdir``: ``(primary, backup)``.

    The primary (``NAME-primary``) is ready (answers STOMP CONNECT) and the backup
    (``NAME-backup``) is blocked on the kahaDB lock of ``workdir/NAME-store`` without any
    listener; it takes over when the primary dies (kill -9: ~0.4 s with ``lock_sleep_ms``
    200). ``timeout`` (seconds) bounds each of the two waits. On failure both are stopped.
    ``tls``: both get the same TLS listener configuration, each on its own ``tls_port``.
    Stop the backup first to avoid a pointless takeover.
    """
    store = Path(workdir).absolute() / f"{name}-store"

    def make(role: str) -> ActiveMQ:
        return ActiveMQ(
            f"{name}-{role}",
            workdir,
            store_dir=store,
            heap_mb=heap_mb,
            lock_sleep_ms=lock_sleep_ms,
            persist_redelivered=persist_redelivered,
            memory_mb=memory_mb,
            tls=tls,
        )

    primary = make("primary")
    backup = make("backup")
    try:
        primary.start()
        primary.wait_ready(timeout)
        backup.start()
        backup.wait_backup(timeout)
    except BaseException:
        backup.stop()
        primary.stop()
        raise
    return primary, backup
