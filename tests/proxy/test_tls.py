"""TLS to a broker, against a local TLS server (trio + ``ssl``, certificates from trustme): the
context built from the options, each failure's one-line reason and ``tls_error`` outcome,
rotation of the PEM files between two connects, the certificate kept for ``/status``.

The same cases against real ActiveMQ and RabbitMQ TLS listeners are in
tests/integration/test_tls.py; these pin the reasons without a JVM.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

import protocol
from config import Broker, Config, ConfigError, load_config, parse_broker_url
from protocol import Command, Frame
from proxy.legs.broker import ConnectFailed, TlsConnectFailed, connect_upstream
from proxy.legs.opening import BrokerStreams
from proxy.legs.tls import TlsTracker, looks_like_tls
from proxy.reconnect.walk import attempt_outcome

CONNECTED = b"CONNECTED\nversion:1.2\nserver:tls-test\n\n\x00"
NOW = datetime.datetime.now(datetime.UTC)


def _serve_one(conn: socket.socket, context: ssl.SSLContext | None) -> None:
    """Handshake (TLS with ``context``), read one frame up to its NUL, answer CONNECTED, wait
    for the peer to leave. Blocking ``ssl`` sends the alert of a failed handshake, as a
    broker does (trio's server side closes without flushing it)."""
    try:
        with conn, context.wrap_socket(conn, server_side=True) if context else conn as stream:
            data = b""
            while b"\x00" not in data:
                chunk = stream.recv(65536)
                if not chunk:
                    return
                data += chunk
            stream.sendall(CONNECTED)
            while stream.recv(65536):
                pass
    except OSError:
        pass


@asynccontextmanager
async def stomp_server(context: ssl.SSLContext | None) -> AsyncIterator[int]:
    """A one-frame STOMP server on 127.0.0.1 in a thread (TLS with ``context``, plain
    without); yields its port. Each connection is served in a thread of its own."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            threading.Thread(target=_serve_one, args=(conn, context), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def server_context(
    ca: trustme.CA,
    *names: str,
    client_ca: trustme.CA | None = None,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> ssl.SSLContext:
    """A server context with a certificate for ``names`` (default localhost, 127.0.0.1)
    issued by ``ca``; demanding a client certificate from ``client_ca`` when given."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert = ca.issue_cert(
        *(names or ("localhost", "127.0.0.1")), not_before=not_before, not_after=not_after
    )
    cert.configure_cert(context)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        client_ca.configure_trust(context)
    return context


class Files:
    """PEM files of a test in ``tmp_path``."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path

    def ca(self, ca: trustme.CA, name: str = "ca.pem") -> str:
        path = self.dir / name
        ca.cert_pem.write_to_path(str(path))
        return str(path)

    def client(self, ca: trustme.CA, *, password: bytes | None = None) -> tuple[str, str]:
        leaf = ca.issue_cert("mq-sidecar-client")
        cert, key = self.dir / "client.crt", self.dir / "client.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        pem = leaf.private_key_pem.bytes()
        if password is not None:
            loaded = serialization.load_pem_private_key(pem, None)
            pem = loaded.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(password),
            )
        key.write_bytes(pem)
        return str(cert), str(key)


async def attempt(config: Config, broker: Broker, streams: BrokerStreams | None = None) -> object:
    """One connect through the daemon's path; returns the Upstream's server header or the
    ConnectFailed it raised."""
    opener = streams or BrokerStreams(config)
    connect = Frame(Command.CONNECT, (("accept-version", "1.2"), ("host", "/")))
    try:
        upstream = await connect_upstream(
            broker,
            connect,
            limits=protocol.Limits(),
            grace=2.0,
            connect_timeout=5.0,
            open_stream=opener,
        )
    except ConnectFailed as exc:
        return exc
    await upstream.aclose()
    return upstream.connected.get("server")


def tls_broker(port: int, **kw: object) -> Broker:
    return Broker("127.0.0.1", port, True, **kw)  # type: ignore[arg-type]


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


async def test_server_auth_tls_connects_and_keeps_the_certificate(files: Files) -> None:
    ca = trustme.CA()
    async with stomp_server(server_context(ca)) as port:
        broker = tls_broker(port)
        config = Config(brokers=(broker,), tls_ca_file=files.ca(ca))
        streams = BrokerStreams(config)
        assert await attempt(config, broker, streams) == "tls-test"
    record = streams.tracker.get(broker.label)
    assert record is not None
    assert record.certificate is not None
    assert record.handshakes == 1
    assert record.failures == 0
    status = record.as_status(NOW.timestamp())
    assert "IP Address:127.0.0.1" in status["names"]  # type: ignore[operator]
    assert status["version"] in ("TLSv1.2", "TLSv1.3")
    assert int(status["expires_in_seconds"]) > 0  # type: ignore[call-overload]


async def test_mutual_tls_with_an_encrypted_key(files: Files) -> None:
    ca, clients = trustme.CA(), trustme.CA()
    cert, key = files.client(clients, password=b"s3cret-key-pw")
    password = files.dir / "key-password"
    password.write_bytes(b"s3cret-key-pw\n")
    async with stomp_server(server_context(ca, client_ca=clients)) as port:
        broker = tls_broker(port)
        config = Config(
            brokers=(broker,),
            tls_ca_file=files.ca(ca),
            tls_cert_file=cert,
            tls_key_file=key,
            tls_key_password_file=str(password),
        )
        assert await attempt(config, broker) == "tls-test"
        # Without the password the key cannot be used: a tls_error naming the files.
        config = Config(
            brokers=(broker,),
            tls_ca_file=config.tls_ca_file,
            tls_cert_file=cert,
            tls_key_file=key,
            tls_key_password_file=str(files.dir / "missing"),
        )
        failure = await attempt(config, broker)
        assert isinstance(failure, TlsConnectFailed)
        assert "tls_key_password_file" in failure.reason


def _reason(failure: object) -> str:
    assert isinstance(failure, TlsConnectFailed), failure
    assert attempt_outcome(failure) == "tls_error"
    assert "\n" not in failure.reason
    return failure.reason


DAY = datetime.timedelta(days=1)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("wrong CA", "unable to get local issuer certificate (not signed by a CA in tls_ca_file"),
        ("expired", "certificate has expired"),
        ("not yet valid", "certificate is not yet valid"),
        ("hostname", "Hostname mismatch"),
        # "the broker demands a client certificate" from its alert, or, when the reset
        # overtakes the alert, SILENT_AFTER_HANDSHAKE, which names tls_cert_file too
        ("client certificate demanded", "client certificate"),
        ("TLS to a plain port", "not a TLS port"),
    ],
)
async def test_each_tls_failure_has_a_one_line_reason(
    files: Files, case: str, expected: str
) -> None:
    ca, other = trustme.CA(), trustme.CA()
    names: tuple[str, ...] = ()
    context: ssl.SSLContext | None
    server_name = None
    match case:
        case "wrong CA":
            context = server_context(other)
        case "expired":
            context = server_context(ca, not_before=NOW - 3 * DAY, not_after=NOW - DAY)
        case "not yet valid":
            context = server_context(ca, not_before=NOW + DAY, not_after=NOW + 3 * DAY)
        case "hostname":
            context, server_name = server_context(ca, "broker-a.example"), "broker-b.example"
        case "client certificate demanded":
            context = server_context(ca, client_ca=other)
        case _:
            context = None
    del names
    async with stomp_server(context) as port:
        broker = tls_broker(port, server_name=server_name)
        config = Config(brokers=(broker,), tls_ca_file=files.ca(ca))
        streams = BrokerStreams(config)
        reason = _reason(await attempt(config, broker, streams))
    assert expected in reason
    record = streams.tracker.get(broker.label)
    assert record is not None
    assert record.error == reason
    assert record.failures == 1


async def test_plain_to_a_tls_port_is_a_tls_error(files: Files) -> None:
    ca = trustme.CA()
    async with stomp_server(server_context(ca)) as port:
        broker = Broker("127.0.0.1", port)
        config = Config(brokers=(broker,))
        reason = _reason(await attempt(config, broker))
    assert "the broker answered in TLS" in reason
    assert "stomp+ssl://" in reason


async def test_hostname_check_can_be_turned_off_per_broker_but_not_the_chain(
    files: Files,
) -> None:
    ca, other = trustme.CA(), trustme.CA()
    async with stomp_server(server_context(ca, "broker-a.example")) as port:
        broker = tls_broker(port, verify_hostname=False)
        config = Config(brokers=(broker,), tls_ca_file=files.ca(ca))
        assert await attempt(config, broker) == "tls-test"
        config = Config(brokers=(broker,), tls_ca_file=files.ca(other, "other.pem"))
        assert "local issuer" in _reason(await attempt(config, broker))


async def test_server_name_is_sent_in_sni_and_verified(files: Files) -> None:
    ca = trustme.CA()
    context = server_context(ca, "broker.messaging.example")
    seen: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: seen.append(name)
    async with stomp_server(context) as port:
        broker = tls_broker(port)
        config = Config(
            brokers=(broker,),
            tls_ca_file=files.ca(ca),
            tls_server_name="broker.messaging.example",
        )
        assert await attempt(config, broker) == "tls-test"
    assert seen == ["broker.messaging.example"]


async def test_rotated_files_apply_at_the_next_connect(files: Files) -> None:
    """A Secret rotated under a running sidecar: the CA file is replaced between two
    connects (as the kubelet swaps the files); the second connect uses the new one."""
    old, new = trustme.CA(), trustme.CA()
    ca_file = files.ca(old)
    broker_old = server_context(old)
    broker_new = server_context(new)
    async with stomp_server(broker_old) as port_old, stomp_server(broker_new) as port_new:
        config = Config(brokers=(tls_broker(port_old),), tls_ca_file=ca_file)
        streams = BrokerStreams(config)
        assert await attempt(config, tls_broker(port_old), streams) == "tls-test"
        assert isinstance(await attempt(config, tls_broker(port_new), streams), TlsConnectFailed)
        new.cert_pem.write_to_path(ca_file)
        assert await attempt(config, tls_broker(port_new), streams) == "tls-test"


async def test_a_missing_file_is_a_tls_error_naming_the_option(files: Files) -> None:
    ca = trustme.CA()
    async with stomp_server(server_context(ca)) as port:
        broker = tls_broker(port)
        config = Config(brokers=(broker,), tls_ca_file=str(files.dir / "nope.pem"))
        reason = _reason(await attempt(config, broker))
    assert reason == f"TLS: tls_ca_file {files.dir / 'nope.pem'}: no such file"


def test_tracker_logs_once_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker("b", 61614, True)
    tracker = TlsTracker([broker])
    for _ in range(5):
        tracker.failed(broker, "TLS: broker certificate refused: certificate has expired")
    tracker.failed(broker, "TLS handshake failed: x")
    assert [r.getMessage() for r in caplog.records] == [
        "broker b:61614: TLS: broker certificate refused: certificate has expired",
        "broker b:61614: TLS handshake failed: x",
    ]
    assert tracker.records()[0].failures == 6


def test_tls_records_are_recognised() -> None:
    assert looks_like_tls(b"\x15\x03\x03\x00\x02")  # an alert
    assert looks_like_tls(b"\x16\x03\x01\x02\x00")  # a handshake
    assert not looks_like_tls(b"CONNE")
    assert not looks_like_tls(b"")


# -- configuration ------------------------------------------------------------------------


def test_artemis_tls_url_options_map_to_brokers() -> None:
    brokers, options = parse_broker_url(
        "failover:(tcp://a:61617?sslEnabled=true&verifyHost=false,"
        "tcp://b?sniHost=mq.example,stomp://c:61613?sslEnabled=false)?sslEnabled=true"
    )
    a, b, c = brokers
    assert (a.tls, a.port, a.verify_hostname, a.server_name) == (True, 61617, False, None)
    assert (b.tls, b.port, b.server_name) == (True, 61614, "mq.example")
    assert not c.tls
    assert options == {}


@pytest.mark.parametrize(
    ("url", "replacement"),
    [
        ("stomp+ssl://a?trustStorePath=/x.jks", "tls_ca_file"),
        ("stomp+ssl://a?keyStorePath=/x.jks", "tls_cert_file + tls_key_file"),
        ("failover:(stomp+ssl://a)?keyStorePassword=x", "tls_cert_file + tls_key_file"),
        ("stomp+ssl://a?trustAll=true", "tls_ca_file with the broker's CA"),
        ("stomp+ssl://a?enabledProtocols=TLSv1.3", "tls_min_version"),
    ],
)
def test_java_keystore_options_are_refused_with_their_pem_replacement(
    url: str, replacement: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_broker_url(url)
    assert "is not supported; use " + replacement in str(info.value)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"MQ_SIDECAR_TLS_CERT_FILE": "/c"}, "tls_cert_file: given without tls_key_file"),
        ({"MQ_SIDECAR_TLS_KEY_FILE": "/k"}, "tls_key_file: given without tls_cert_file"),
        ({"MQ_SIDECAR_TLS_MIN_VERSION": "1.1"}, "tls_min_version: must be one of '1.2', '1.3'"),
        ({"MQ_SIDECAR_TLS_CIPHERS": "NOPE-NOTHING"}, "tls_ciphers: OpenSSL selects no cipher"),
        ({"MQ_SIDECAR_TLS_SERVER_NAME": "not a name"}, "tls_server_name: not a host name"),
    ],
)
def test_bad_tls_options_are_refused_at_load(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"MQ_SIDECAR_BROKERS": "stomp+ssl://a", **env})
    assert problem in str(info.value)


def test_tls_min_version_may_be_a_toml_number(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('brokers = "stomp+ssl://a"\ntls_min_version = 1.3\n')
    assert load_config(path=path, env={}).tls_min_version == "1.3"
