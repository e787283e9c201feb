"""The test bed's TLS STOMP listeners (issue 15), against the real brokers.

Per broker kind, three brokers are started once for the module, in parallel, from one
trustme CA: ``server-only`` (no client certificates asked for, ECDSA key), ``mutual``
(``require_client_cert``: ActiveMQ ``needClientAuth``, RabbitMQ ``fail_if_no_peer_cert``) and
``optional`` (a client CA but no requirement; RSA key). A plain ``ssl`` client does the
handshake (verifying the broker and its host name) and a STOMP CONNECT.

Budget: ActiveMQ ~1.5 s for the three (+ ~2.5 s for the pair and ~1.5 s for the bad server
certificates), RabbitMQ ~8 s for the three nodes.
"""

from __future__ import annotations

import datetime
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme

from testbed import (
    ActiveMQ,
    BrokerError,
    BrokerProcess,
    RabbitMQ,
    TlsClientFiles,
    TlsListener,
    activemq_installed,
    rabbitmq_installed,
    start_activemq_pair,
    write_client_files,
    write_server_files,
)

pytestmark = pytest.mark.timeout(180)

#: Seconds for any one socket operation against a broker on loopback.
IO_TIMEOUT = 10.0

TLS12 = ssl.TLSVersion.TLSv1_2
TLS13 = ssl.TLSVersion.TLSv1_3
BOTH_VERSIONS = [pytest.param(TLS12, id="tls1.2"), pytest.param(TLS13, id="tls1.3")]

#: The listener configurations each broker kind runs (see the module docstring).
CONFIGS = ("server-only", "mutual", "optional")


class Pki:
    """The module's certificates: one CA for servers and clients, and a stranger CA."""

    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        self.stranger_ca = trustme.CA()
        self.listeners: dict[str, TlsListener] = {
            "server-only": write_server_files(self.ca, directory / "server-only"),
            "mutual": write_server_files(
                self.ca, directory / "mutual", client_ca=self.ca, require_client_cert=True
            ),
            "optional": write_server_files(
                self.ca,
                directory / "optional",
                client_ca=self.ca,
                key_type=trustme.KeyType.RSA,
            ),
        }
        self.client = write_client_files(self.ca, directory / "clients", name="client")
        self.client_rsa = write_client_files(
            self.ca, directory / "clients", name="client-rsa", key_type=trustme.KeyType.RSA
        )
        #: A well-formed client certificate from a CA no broker trusts.
        self.stranger = write_client_files(self.stranger_ca, directory / "clients", name="other")
        self.server_ca = self.listeners["server-only"].server_ca
        assert self.server_ca is not None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def start_all(brokers: list[BrokerProcess]) -> None:
    """Start every broker, then wait for each (they start in parallel); stop all on failure."""
    try:
        for broker in brokers:
            broker.start()
        for broker in brokers:
            broker.wait_ready(timeout=60.0)
    except BaseException:
        for broker in reversed(brokers):
            broker.stop()
        raise


def _require(installed: Callable[[], bool], what: str) -> None:
    # As tests/conftest.py: a missing broker FAILS (CI installs them), -m deselects.
    if not installed():
        pytest.fail(f"{what} is not installed: run scripts/setup.sh", pytrace=False)


@pytest.fixture(scope="module")
def amq_tls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[dict[str, ActiveMQ]]:
    _require(activemq_installed, "ActiveMQ (Debian package activemq, java)")
    workdir = tmp_path_factory.mktemp("amq-tls")
    brokers = {c: ActiveMQ(f"amq-{c}", workdir, tls=pki.listeners[c]) for c in CONFIGS}
    start_all(list(brokers.values()))
    yield brokers
    for broker in brokers.values():
        broker.stop()


@pytest.fixture(scope="module")
def rmq_tls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[dict[str, RabbitMQ]]:
    _require(rabbitmq_installed, "RabbitMQ (Debian package rabbitmq-server, rabbitmq_stomp)")
    workdir = tmp_path_factory.mktemp("rmq-tls")
    brokers = {c: RabbitMQ(f"rmq-{c}", workdir, tls=pki.listeners[c]) for c in CONFIGS}
    start_all(list(brokers.values()))
    yield brokers
    for broker in brokers.values():
        broker.stop()


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("activemq", marks=pytest.mark.activemq),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ],
)
def tls_brokers(request: pytest.FixtureRequest) -> dict[str, BrokerProcess]:
    """The three TLS brokers of each kind in turn, by configuration name."""
    fixture = "amq_tls" if request.param == "activemq" else "rmq_tls"
    brokers: dict[str, BrokerProcess] = request.getfixturevalue(fixture)
    return brokers


# --- the client ----------------------------------------------------------------------------


def client_context(
    pki: Pki,
    *,
    cert: TlsClientFiles | None = None,
    version: ssl.TLSVersion | None = None,
    trust: Path | None = None,
) -> ssl.SSLContext:
    """A verifying client context trusting ``trust`` (default: the module's CA)."""
    ctx = ssl.create_default_context(cafile=str(trust or pki.server_ca))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    if cert is not None:
        ctx.load_cert_chain(cert.cert_chain, cert.key)
    return ctx


def read_frame(sock: socket.socket) -> bytes:
    """Bytes up to the first NUL (one STOMP frame); EOFError if the peer closes first."""
    buf = b""
    while b"\0" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise EOFError(f"closed after {buf!r}")
        buf += chunk
    return buf.lstrip(b"\r\n").partition(b"\0")[0]


def connect_frame(broker: BrokerProcess) -> bytes:
    """STOMP 1.2 CONNECT; RabbitMQ wants its vhost as ``host`` and takes guest/guest."""
    return (
        f"CONNECT\naccept-version:1.2\nhost:{broker.vhost}\nlogin:guest\npasscode:guest\n"
        "heart-beat:0,0\n\n\0"
    ).encode()


def stomp_over_tls(
    broker: BrokerProcess, ctx: ssl.SSLContext, *, server_hostname: str = "localhost"
) -> tuple[str, str]:
    """TLS handshake with ``broker``'s TLS port, CONNECT, DISCONNECT; return the negotiated
    TLS version and the reply frame's command. Raises ``ssl.SSLError``, ``OSError`` or
    ``EOFError`` when the broker refuses (during the handshake, or, in TLS 1.3 where the
    client finishes first, at the first read)."""
    assert broker.tls_port is not None
    with (
        socket.create_connection((broker.host, broker.tls_port), timeout=IO_TIMEOUT) as raw,
        ctx.wrap_socket(raw, server_hostname=server_hostname) as sock,
    ):
        version = sock.version() or "?"
        sock.sendall(connect_frame(broker))
        command = read_frame(sock).split(b"\n", 1)[0].decode()
        if command == "CONNECTED":
            sock.sendall(b"DISCONNECT\n\n\0")
        return version, command


def assert_refused(broker: BrokerProcess, ctx: ssl.SSLContext) -> None:
    with pytest.raises((ssl.SSLError, OSError, EOFError)):
        stomp_over_tls(broker, ctx)


# --- the listeners -------------------------------------------------------------------------


def test_tls_connect_verifies_broker_and_host(
    tls_brokers: dict[str, BrokerProcess], pki: Pki
) -> None:
    broker = tls_brokers["server-only"]
    assert broker.tls_port not in (None, broker.stomp_port)
    assert broker.stomp_ssl_url.startswith(f"stomp+ssl://127.0.0.1:{broker.tls_port}")
    ctx = client_context(pki)
    assert stomp_over_tls(broker, ctx)[1] == "CONNECTED"
    # The certificate names 127.0.0.1 too (what stomp_ssl_url says).
    assert stomp_over_tls(broker, ctx, server_hostname="127.0.0.1")[1] == "CONNECTED"
    # The plain listener is still there.
    with socket.create_connection((broker.host, broker.stomp_port), timeout=IO_TIMEOUT) as plain:
        plain.sendall(connect_frame(broker))
        assert read_frame(plain).startswith(b"CONNECTED\n")


@pytest.mark.parametrize("version", BOTH_VERSIONS)
@pytest.mark.parametrize("config", CONFIGS)
def test_tls_versions_without_client_cert(
    tls_brokers: dict[str, BrokerProcess], pki: Pki, config: str, version: ssl.TLSVersion
) -> None:
    ctx = client_context(pki, version=version)
    broker = tls_brokers[config]
    if config == "mutual":
        assert_refused(broker, ctx)
    else:
        negotiated, command = stomp_over_tls(broker, ctx)
        assert command == "CONNECTED"
        assert negotiated == {TLS12: "TLSv1.2", TLS13: "TLSv1.3"}[version]


@pytest.mark.parametrize("version", BOTH_VERSIONS)
@pytest.mark.parametrize("config", ["mutual", "optional"])
def test_client_certificate_accepted(
    tls_brokers: dict[str, BrokerProcess], pki: Pki, config: str, version: ssl.TLSVersion
) -> None:
    for cert in (pki.client, pki.client_rsa):
        ctx = client_context(pki, cert=cert, version=version)
        assert stomp_over_tls(tls_brokers[config], ctx)[1] == "CONNECTED"


@pytest.mark.parametrize("version", BOTH_VERSIONS)
@pytest.mark.parametrize("config", ["mutual", "optional"])
def test_client_certificate_of_another_ca_refused(
    tls_brokers: dict[str, BrokerProcess], pki: Pki, config: str, version: ssl.TLSVersion
) -> None:
    assert_refused(tls_brokers[config], client_context(pki, cert=pki.stranger, version=version))


def test_server_only_asks_for_no_certificate(
    tls_brokers: dict[str, BrokerProcess], pki: Pki
) -> None:
    # The broker requests no certificate, so the client sends none: any client cert is fine.
    ctx = client_context(pki, cert=pki.stranger)
    assert stomp_over_tls(tls_brokers["server-only"], ctx)[1] == "CONNECTED"


def test_client_that_does_not_trust_the_broker_fails(
    tls_brokers: dict[str, BrokerProcess], pki: Pki, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    pki.stranger_ca.cert_pem.write_to_path(str(other))
    with pytest.raises(ssl.SSLCertVerificationError):
        stomp_over_tls(tls_brokers["server-only"], client_context(pki, trust=other))


@pytest.mark.parametrize("config", CONFIGS)
def test_plain_stomp_to_the_tls_port_gets_an_alert_and_eof(
    tls_brokers: dict[str, BrokerProcess], config: str
) -> None:
    broker = tls_brokers[config]
    assert broker.tls_port is not None
    with socket.create_connection((broker.host, broker.tls_port), timeout=IO_TIMEOUT) as raw:
        raw.sendall(connect_frame(broker))
        data = b""
        while chunk := raw.recv(4096):
            data += chunk
    # One TLS record: content type 21 (alert), then the broker closes the connection.
    assert data[:1] == b"\x15", data
    assert b"CONNECTED" not in data


# --- ActiveMQ only: the pair, and bad server certificates -----------------------------------


@pytest.mark.activemq
def test_activemq_pair_has_tls_on_both(tmp_path: Path, pki: Pki) -> None:
    _require(activemq_installed, "ActiveMQ (Debian package activemq, java)")
    primary, backup = start_activemq_pair(tmp_path, tls=pki.listeners["mutual"])
    try:
        assert primary.tls_port is not None
        assert backup.tls_port is not None
        assert len({primary.stomp_port, primary.tls_port, backup.stomp_port, backup.tls_port}) == 4
        ctx = client_context(pki, cert=pki.client)
        assert stomp_over_tls(primary, ctx)[1] == "CONNECTED"
        # The backup, blocked on the store lock, listens on neither port.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((backup.host, backup.tls_port), timeout=IO_TIMEOUT)
        primary.kill()
        backup.wait_ready(timeout=30.0)
        assert stomp_over_tls(backup, ctx)[1] == "CONNECTED"
        assert_refused(backup, client_context(pki))
    finally:
        backup.stop()
        primary.stop()


@pytest.mark.activemq
def test_bad_server_certificates_are_served_and_rejected_by_clients(
    tmp_path: Path, pki: Pki
) -> None:
    _require(activemq_installed, "ActiveMQ (Debian package activemq, java)")
    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    listeners = {
        "expired": write_server_files(
            pki.ca, tmp_path / "expired", not_before=now - 10 * day, not_after=now - day
        ),
        "future": write_server_files(
            pki.ca, tmp_path / "future", not_before=now + day, not_after=now + 10 * day
        ),
        "wronghost": write_server_files(pki.ca, tmp_path / "wrong", hostnames=("wrong.example",)),
    }
    errors = {
        "expired": "certificate has expired",
        "future": "certificate is not yet valid",
        "wronghost": "Hostname mismatch",
    }
    brokers: dict[str, BrokerProcess] = {
        name: ActiveMQ(f"amq-{name}", tmp_path, tls=listener)
        for name, listener in listeners.items()
    }
    # The broker starts with any of them: only clients check the validity and host name.
    start_all(list(brokers.values()))
    try:
        for name, error in errors.items():
            with pytest.raises(ssl.SSLCertVerificationError, match=error):
                stomp_over_tls(brokers[name], client_context(pki))
            unverified = client_context(pki)
            unverified.check_hostname = False
            unverified.verify_mode = ssl.CERT_NONE
            assert stomp_over_tls(brokers[name], unverified)[1] == "CONNECTED"
    finally:
        for broker in brokers.values():
            broker.stop()


# --- without brokers ---------------------------------------------------------------------


def test_listener_requiring_client_certs_needs_a_ca(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="client_ca"):
        TlsListener(tmp_path / "c.pem", tmp_path / "k.pem", require_client_cert=True)


def test_broker_without_tls_has_no_ssl_url(tmp_path: Path) -> None:
    broker = ActiveMQ("plain", tmp_path)
    assert broker.tls_port is None
    with pytest.raises(BrokerError, match="no TLS listener"):
        _ = broker.stomp_ssl_url


def test_rabbitmq_tls_configuration(tmp_path: Path, pki: Pki) -> None:
    conf = {}
    for config in CONFIGS:
        node = RabbitMQ(f"conf-{config}", tmp_path, tls=pki.listeners[config])
        node._prepare()
        conf[config] = (node.base_dir / "rabbitmq.conf").read_text()
        assert f"stomp.listeners.ssl.1 = 127.0.0.1:{node.tls_port}\n" in conf[config]
        assert node.stomp_ssl_url == f"stomp+ssl://127.0.0.1:{node.tls_port}?host=/"
    assert "ssl_options.verify = verify_none" in conf["server-only"]
    assert "cacertfile" not in conf["server-only"]
    assert "ssl_options.fail_if_no_peer_cert = true" in conf["mutual"]
    assert "ssl_options.fail_if_no_peer_cert = false" in conf["optional"]
    for config in ("mutual", "optional"):
        assert "ssl_options.verify = verify_peer" in conf[config]


def test_rabbitmq_without_tls_renders_no_tls_lines(tmp_path: Path) -> None:
    node = RabbitMQ("conf-plain", tmp_path)
    node._prepare()
    lines = (node.base_dir / "rabbitmq.conf").read_text().splitlines()
    settings = [line for line in lines if line and not line.startswith("#")]
    assert not [line for line in settings if "ssl" in line]
    assert not [line for line in lines if "$" in line]


def test_rabbitmq_renders_its_own_conf_lines(tmp_path: Path) -> None:
    """``conf=`` lines end up in rabbitmq.conf (the differential tests' implicit connect)."""
    node = RabbitMQ("conf-extra", tmp_path, conf=["stomp.implicit_connect = true"])
    node._prepare()
    lines = (node.base_dir / "rabbitmq.conf").read_text().splitlines()
    assert "stomp.implicit_connect = true" in lines
    assert not [line for line in lines if "$" in line]
