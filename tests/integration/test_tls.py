"""TLS to real brokers through the sidecar (issue 15): ActiveMQ's ``stomp+ssl`` transport
connector and RabbitMQ's ``rabbitmq_stomp`` TLS listener, certificates from a per-run trustme
CA (the test bed turns them into what each broker reads).

Server-auth and mutual TLS on both brokers; each failure (wrong CA, expired, not yet valid,
another host's certificate, a client certificate demanded, TLS to a plain port, plain to a TLS
port) is a connect attempt with outcome ``tls_error``, a one-line reason in the log and in
``/status``, and the round moves on to the next broker; rotated PEM files apply at the next
connect; a kill -9 failover between two TLS brokers loses and duplicates nothing.
"""

from __future__ import annotations

import datetime
import logging
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from protocol import Command
from testbed import ActiveMQ, RabbitMQ, TlsListener, write_client_files, write_server_files
from tests.conftest import ActiveMQPairFactory, _require_activemq, _require_rabbitmq
from tests.integration.support import (
    Client,
    RawClient,
    SidecarThread,
    sidecar_config,
    unique,
    wait_until,
)
from tests.integration.test_failover import exactly_once, next_event, run_transfer

pytestmark = pytest.mark.timeout(300)

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)

#: A session's first connect tries each broker once, then the app hears why.
ONE_ROUND = {"initial_connect_attempts": 1, "initial_connect_period": 0, "retry_interval": 50}


@dataclass
class Pki:
    """The per-run CAs and the files made from them."""

    ca: trustme.CA  # issues the brokers' certificates
    clients: trustme.CA  # issues client certificates the brokers trust
    stranger: trustme.CA  # trusted by nobody
    dir: Path

    @property
    def ca_file(self) -> str:
        path = self.dir / "trusted-ca.pem"
        if not path.exists():
            self.ca.cert_pem.write_to_path(str(path))
        return str(path)

    def stranger_ca_file(self) -> str:
        path = self.dir / "stranger-ca.pem"
        self.stranger.cert_pem.write_to_path(str(path))
        return str(path)

    def client(self, name: str, ca: trustme.CA | None = None) -> dict[str, str]:
        files = write_client_files(ca or self.clients, self.dir / name, name=name)
        return {"tls_cert_file": str(files.cert_chain), "tls_key_file": str(files.key)}

    def listener(self, name: str, **kw: Any) -> TlsListener:
        return write_server_files(self.ca, self.dir / name, client_ca=self.clients, **kw)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(trustme.CA(), trustme.CA(), trustme.CA(), tmp_path_factory.mktemp("pki"))


def _amq(tmp: pytest.TempPathFactory, name: str, tls: TlsListener) -> Iterator[ActiveMQ]:
    _require_activemq()
    with ActiveMQ(name, tmp.mktemp(name), tls=tls) as broker:
        yield broker


def _rmq(tmp: pytest.TempPathFactory, name: str, tls: TlsListener) -> Iterator[RabbitMQ]:
    _require_rabbitmq()
    with RabbitMQ(name, tmp.mktemp(name), tls=tls) as broker:
        yield broker


@pytest.fixture(scope="module")
def amq_tls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ActiveMQ]:
    """Server-auth TLS (a client certificate is verified if offered, not required)."""
    yield from _amq(tmp_path_factory, "amq-tls", pki.listener("amq-tls"))


@pytest.fixture(scope="module")
def amq_mtls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ActiveMQ]:
    """Mutual TLS: ``transport.needClientAuth=true``."""
    listener = pki.listener("amq-mtls", require_client_cert=True)
    yield from _amq(tmp_path_factory, "amq-mtls", listener)


@pytest.fixture(scope="module")
def rmq_tls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[RabbitMQ]:
    """Server-auth TLS (``verify_peer``, ``fail_if_no_peer_cert = false``)."""
    yield from _rmq(tmp_path_factory, "rmq-tls", pki.listener("rmq-tls"))


@pytest.fixture(scope="module")
def rmq_mtls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[RabbitMQ]:
    """Mutual TLS: ``fail_if_no_peer_cert = true``."""
    listener = pki.listener("rmq-mtls", require_client_cert=True)
    yield from _rmq(tmp_path_factory, "rmq-mtls", listener)


def tls_url(broker: ActiveMQ | RabbitMQ) -> str:
    return broker.stomp_ssl_url


def plain_url(broker: ActiveMQ | RabbitMQ) -> str:
    return broker.stomp_url


def roundtrip(sidecar: SidecarThread) -> None:
    """One message sent and received through the sidecar."""
    client = Client(sidecar.address)
    client.connect()
    dest = unique()
    client.conn.subscribe(dest, id="s1", ack="auto")
    client.conn.send(dest, "over TLS", headers={"receipt": "r1"})
    client.expect("RECEIPT")
    assert client.expect("MESSAGE").body == "over TLS"
    client.close()


def broker_status(sidecar: SidecarThread, label: str) -> dict[str, Any]:
    (entry,) = [b for b in sidecar.status()["brokers"] if b["broker"] == label]
    assert isinstance(entry, dict)
    return entry


def refused(sidecar: SidecarThread) -> str:
    """CONNECT through the sidecar, expecting an ERROR: its message."""
    app = RawClient(sidecar.address)
    app.send_frame("CONNECT", {"accept-version": "1.2", "host": "/"})
    error = app.frame()
    app.close()
    assert error.command is Command.ERROR, error
    return error.get("message") or ""


def label_of(url: str) -> str:
    match = re.search(r"//([^/?]+)", url)
    assert match is not None
    return match.group(1)


def tls_errors(sidecar: SidecarThread, label: str) -> float:
    """``mq_sidecar_upstream_connect_attempts_total{broker=label, outcome="tls_error"}``."""
    pattern = (
        r'mq_sidecar_upstream_connect_attempts_total\{broker="'
        + re.escape(label)
        + r'",outcome="tls_error"\} (\S+)'
    )
    match = re.search(pattern, sidecar.metrics())
    return float(match.group(1)) if match else 0.0


# -- it works ---------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["activemq", "rabbitmq"])
def test_server_auth_tls(which: str, pki: Pki, request: pytest.FixtureRequest) -> None:
    broker = request.getfixturevalue("amq_tls" if which == "activemq" else "rmq_tls")
    url = tls_url(broker)
    config = sidecar_config(url, tls_ca_file=pki.ca_file)
    with SidecarThread(config) as sidecar:
        roundtrip(sidecar)
        tls = broker_status(sidecar, label_of(url))["tls"]
        gauge = re.search(
            r"mq_sidecar_upstream_tls_cert_expiry_seconds\{[^}]*\} (\S+)", sidecar.metrics()
        )
    print(f"\n[/status brokers[].tls, {which}] {tls}")
    assert tls["subject"].startswith("O=trustme")
    assert tls["version"] in ("TLSv1.2", "TLSv1.3")
    assert tls["failures"] == 0
    assert tls["expires_in_seconds"] > 365 * 86400
    assert gauge is not None
    assert abs(float(gauge.group(1)) - (time.time() + tls["expires_in_seconds"])) < 60


@pytest.mark.parametrize("which", ["activemq", "rabbitmq"])
def test_mutual_tls(which: str, pki: Pki, request: pytest.FixtureRequest) -> None:
    broker = request.getfixturevalue("amq_mtls" if which == "activemq" else "rmq_mtls")
    url = tls_url(broker)
    config = sidecar_config(url, tls_ca_file=pki.ca_file, **pki.client("mtls-client"))
    with SidecarThread(config) as sidecar:
        roundtrip(sidecar)


# -- each failure is explicit ------------------------------------------------------------------


@pytest.fixture(scope="module")
def amq_expired(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ActiveMQ]:
    listener = pki.listener("amq-expired", not_before=NOW - 3 * DAY, not_after=NOW - DAY)
    yield from _amq(tmp_path_factory, "amq-expired", listener)


@pytest.fixture(scope="module")
def amq_future(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ActiveMQ]:
    listener = pki.listener("amq-future", not_before=NOW + DAY, not_after=NOW + 3 * DAY)
    yield from _amq(tmp_path_factory, "amq-future", listener)


FAILURES = {
    # case: (broker fixture, URL of the bad broker, options, expected words in the reason)
    "wrong CA": ("tls", tls_url, "stranger", "unable to get local issuer certificate"),
    "expired": ("expired", tls_url, "", "certificate has expired"),
    "not yet valid": ("future", tls_url, "", "certificate is not yet valid"),
    "hostname mismatch": ("tls", tls_url, "wrong-name", "Hostname mismatch"),
    "client certificate demanded": ("mtls", tls_url, "", "client certificate"),
    "TLS to a plain port": (
        "tls",
        lambda b: "stomp+ssl://" + b.stomp_url.split("//")[1],
        "",
        "not a TLS port",
    ),
    "plain to a TLS port": (
        "tls",
        lambda b: "stomp://" + b.stomp_ssl_url.split("//")[1].replace("127.0.0.1", "localhost"),
        "",
        "the broker answered in TLS",
    ),
}


# Certificate dates are the client's check, the same whichever broker shows the certificate:
# ActiveMQ's listener shows the expired and the not-yet-valid one, RabbitMQ's the others.
CASES = [
    (case, which)
    for case in FAILURES
    for which in ("activemq", "rabbitmq")
    if which == "activemq" or FAILURES[case][0] not in ("expired", "future")
]


@pytest.mark.parametrize(("case", "which"), CASES)
def test_each_tls_failure_is_reported_and_the_round_moves_on(
    case: str,
    which: str,
    pki: Pki,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bad broker is first in the list, a good one second: the app connects (to the
    second), the attempt on the first is counted as ``tls_error`` with a one-line reason, in
    the log and in ``/status``."""
    kind, make_url, option, expected = FAILURES[case]
    prefix = "amq" if which == "activemq" else "rmq"
    bad = request.getfixturevalue(f"{prefix}_{kind}")
    good = request.getfixturevalue(f"{prefix}_tls")
    bad_url = make_url(bad)
    options: dict[str, object] = {"tls_ca_file": pki.ca_file, "broker_probe_interval": 200}
    if option == "stranger":
        options["tls_ca_file"] = pki.stranger_ca_file()
        good_url = plain_url(good)  # the good one must not depend on the wrong CA
    else:
        good_url = tls_url(good)
    if option == "wrong-name":  # the same broker, named as its certificate does not
        bad_url = bad_url.replace("127.0.0.1", "localhost")
        bad_url += ("&" if "?" in bad_url else "?") + "sniHost=broker.elsewhere.example"
    config = sidecar_config(f"failover:({bad_url},{good_url})", **options, **ONE_ROUND)
    label = label_of(bad_url)
    caplog.set_level(logging.INFO)
    with SidecarThread(config) as sidecar:
        roundtrip(sidecar)  # connected: the round moved on to the second broker
        assert tls_errors(sidecar, label) >= 1
        wait_until(lambda: expected in broker_status(sidecar, label)["detail"], 20)
        entry = broker_status(sidecar, label)
    logged = [r.getMessage() for r in caplog.records if expected in r.getMessage()]
    reason = entry["detail"]
    print(f"\n[{which}: {case}] /status detail: {reason}\n  log: {logged[:1]}")
    assert "\n" not in reason
    assert entry["state"] == "down"
    assert logged, "the reason is in the log"


@pytest.mark.parametrize("which", ["activemq", "rabbitmq"])
def test_a_refused_handshake_reaches_the_app_when_no_broker_is_left(
    which: str, pki: Pki, request: pytest.FixtureRequest
) -> None:
    broker = request.getfixturevalue("amq_mtls" if which == "activemq" else "rmq_mtls")
    config = sidecar_config(tls_url(broker), tls_ca_file=pki.ca_file, **ONE_ROUND)
    with SidecarThread(config) as sidecar:
        message = refused(sidecar)
    print(f"\n[{which}: no client certificate] ERROR to the app: {message}")
    assert "client certificate" in message


# -- rotation ------------------------------------------------------------------------------


def test_rotated_ca_and_client_certificate_apply_at_the_next_connect(
    pki: Pki, amq_mtls: ActiveMQ, tmp_path: Path
) -> None:
    """The Secret's files are replaced under a running sidecar (as the kubelet does): the
    next session's connect reads the new ones, no restart."""
    ca_file, cert_file, key_file = (tmp_path / n for n in ("ca.pem", "tls.crt", "tls.key"))
    shutil.copy(pki.stranger_ca_file(), ca_file)
    untrusted = pki.client("untrusted-client", ca=pki.stranger)
    shutil.copy(untrusted["tls_cert_file"], cert_file)
    shutil.copy(untrusted["tls_key_file"], key_file)
    config = sidecar_config(
        tls_url(amq_mtls),
        tls_ca_file=str(ca_file),
        tls_cert_file=str(cert_file),
        tls_key_file=str(key_file),
        **ONE_ROUND,
    )
    label = label_of(tls_url(amq_mtls))
    with SidecarThread(config) as sidecar:
        # 1. the broker's CA is not trusted yet
        assert "local issuer" in refused(sidecar)
        # 2. the CA rotated in; the client certificate is still one the broker refuses
        shutil.copy(pki.ca_file, ca_file)
        refusal = refused(sidecar)
        # 3. the client certificate rotated in too
        trusted = pki.client("rotated-client")
        shutil.copy(trusted["tls_cert_file"], cert_file)
        shutil.copy(trusted["tls_key_file"], key_file)
        roundtrip(sidecar)
        record = broker_status(sidecar, label)["tls"]
    print(f"\n[rotation] refused before the client certificate rotated: {refusal}")
    assert "TLS" in refusal
    assert record["handshakes"] >= 1
    assert record["failures"] >= 2


# -- failover -------------------------------------------------------------------------------


def test_kill9_failover_between_two_tls_brokers_loses_nothing(
    pki: Pki, activemq_pair: ActiveMQPairFactory
) -> None:
    """A shared-store ActiveMQ pair, both with a TLS listener; the sidecar reaches them only
    over TLS; kill -9 of the primary under 5,000 persistent messages: every one arrives
    exactly once, every receipt reaches the producer."""
    listener = pki.listener("pair", require_client_cert=True)
    primary, backup = activemq_pair(lock_sleep_ms=200, tls=listener)
    config = sidecar_config(
        f"failover:({primary.stomp_ssl_url},{backup.stomp_ssl_url})",
        tls_ca_file=pki.ca_file,
        upstream_heartbeat="1000,1000",
        retry_interval=50,
        max_retry_interval=500,
        **pki.client("pair-client"),
    )
    n = 5_000
    with SidecarThread(config) as sidecar:
        consumer, producer, control = run_transfer(sidecar, n, primary.kill)
        receipts, errors = producer.outcome(60)
        event = next_event(control, "FAILOVER", to_broker=f"127.0.0.1:{backup.tls_port}")
        tls = broker_status(sidecar, f"127.0.0.1:{backup.tls_port}")["tls"]
        consumer.close()
        producer.client.close()
        control.close()
    missing, duplicated = exactly_once(consumer.bodies, n)
    print(
        f"\n[TLS kill -9 failover] sent={n} receipts={receipts} missing={missing} "
        f"duplicates={duplicated} outage_ms={event['outage_ms']} backup {tls['version']}"
    )
    assert (missing, duplicated) == (0, 0)
    assert errors == []
    assert receipts == n
