"""TLS to the brokers: a client context built afresh for every connect, one-line reasons for
every way a handshake fails, and what each broker's certificate said (``/status``, the
``mq_sidecar_upstream_tls_cert_expiry_seconds`` gauge).

Contexts are never cached: the PEM files (``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``,
``tls_key_password_file``) are read at each connect, so a Kubernetes Secret rotated under a
running sidecar applies at the next (re)connect without a restart (docs/configuration.md,
"TLS to the brokers"). Building one costs about a millisecond with a private CA, nothing next
to the TCP and TLS round trips it precedes.

The chain is always verified (``CERT_REQUIRED``); only the host name check can be turned off
(``tls_verify_hostname = false`` or ``?verifyHost=false``), as in Artemis.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from config import Broker, Config

__all__ = [
    "DIAGNOSIS_SECONDS",
    "PLAIN_PORT",
    "SILENT_AFTER_HANDSHAKE",
    "TLS_PORT",
    "PeerCertificate",
    "TlsFailed",
    "TlsRecord",
    "TlsTracker",
    "answers_stomp",
    "answers_tls",
    "client_context",
    "looks_like_tls",
    "peer_certificate",
    "server_name",
    "tls_failure",
]

log = logging.getLogger("mq_sidecar.tls")

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}

# Short names of the subject attributes a certificate usually carries (RFC 4514 §3).
_SHORT = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "domainComponent": "DC",
}

_CLOSED = "the broker closed the connection during the TLS handshake"
_NOT_TLS = "the broker did not answer in TLS: not a TLS port? (use stomp:// for a plain one)"
#: The reason of a handshake the broker closed without an alert.
CLOSED_IN_HANDSHAKE = _CLOSED

# OpenSSL's reason codes for the alerts a broker sends when it will not accept us, and
# for a peer that does not speak TLS at all, with what an operator should read.
_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the broker demands a client certificate "
    "(set tls_cert_file and tls_key_file)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the broker refused the client certificate "
    "(bad certificate: is it signed by a CA the broker trusts?)",
    "TLSV1_ALERT_UNKNOWN_CA": "the broker does not trust the CA of the client certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the broker says the client certificate has expired",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the broker refused the client certificate "
    "(certificate unknown)",
    "TLSV1_ALERT_PROTOCOL_VERSION": "no TLS version in common (tls_min_version)",
    "UNSUPPORTED_PROTOCOL": "no TLS version in common (tls_min_version)",
    "NO_CIPHERS_AVAILABLE": "no cipher in common (tls_ciphers)",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "the broker ended the handshake (handshake failure: "
    "a client certificate demanded but not sent, or no cipher in common)",
    "WRONG_VERSION_NUMBER": _NOT_TLS,
    "RECORD_LAYER_FAILURE": _NOT_TLS,
    "PACKET_LENGTH_TOO_LONG": _NOT_TLS,
    # OpenSSL's names for a plain-text answer that starts like HTTP ("CONNECT", "ERROR"...).
    "HTTPS_PROXY_REQUEST": _NOT_TLS,
    "HTTP_REQUEST": _NOT_TLS,
    "UNEXPECTED_EOF_WHILE_READING": CLOSED_IN_HANDSHAKE,
}


# Alerts with which a broker refuses a client certificate, or the lack of one.
_REFUSED_CLIENT = frozenset(
    {
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    }
)


class TlsFailed(OSError):
    """A TLS connect failed before any STOMP frame: ``str()`` is the one-line reason.

    Raised by :func:`client_context` for files that cannot be used, and by
    :class:`proxy.legs.broker.BrokerStreams` for a failed handshake (:func:`tls_failure` gives
    the reason). An ``OSError``, as ``ssl.SSLError`` is, so every handler of a connection
    failure handles it.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "TLS failed"


@dataclass(frozen=True, slots=True)
class PeerCertificate:
    """What a broker's certificate said in the last successful handshake.

    Attributes:
        subject: RFC 4514-style ``CN=broker, O=example``.
        issuer: The issuer, same form.
        not_before: Start of validity, Unix seconds.
        not_after: Expiry, Unix seconds (the gauge's value).
        names: Its subjectAltName entries, ``("DNS:broker", "IP Address:127.0.0.1")``.
        version: The negotiated protocol (``TLSv1.3``).
        cipher: The negotiated cipher suite.
        server_name: The name sent in SNI and verified (None: none sent, an IP literal).
    """

    subject: str
    issuer: str
    not_before: float
    not_after: float
    names: tuple[str, ...]
    version: str
    cipher: str
    server_name: str | None


@dataclass(slots=True)
class TlsRecord:
    """TLS to one broker, as :class:`TlsTracker` last saw it (wall-clock Unix seconds)."""

    broker: str
    certificate: PeerCertificate | None = None
    handshake_at: float | None = None
    error: str | None = None
    error_at: float | None = None
    handshakes: int = 0
    failures: int = 0

    def as_status(self, now: float) -> dict[str, object]:
        """The ``/status`` view: certificate subject, issuer, expiry (ISO 8601 and seconds
        left), protocol and cipher of the last handshake, and the last failure."""
        out: dict[str, object] = {
            "handshakes": self.handshakes,
            "failures": self.failures,
            "last_error": self.error,
            "last_error_at": _iso(self.error_at),
        }
        cert = self.certificate
        if cert is not None:
            out.update(
                subject=cert.subject,
                issuer=cert.issuer,
                names=list(cert.names),
                not_before=_iso(cert.not_before),
                not_after=_iso(cert.not_after),
                expires_in_seconds=round(cert.not_after - now),
                version=cert.version,
                cipher=cert.cipher,
                server_name=cert.server_name,
                last_handshake_at=_iso(self.handshake_at),
            )
        return out


class TlsTracker:
    """Per TLS broker: the last certificate seen and the last failure, for ``/status`` and
    the expiry gauge. Logs one line when a broker's TLS starts failing or changes its reason,
    and one when it works again, not one per attempt (300 sessions reconnect at once)."""

    def __init__(self, brokers: Iterable[Broker]) -> None:
        self._records = {b.label: TlsRecord(b.label) for b in brokers if b.tls and not b.dns}
        self._logged: dict[str, str | None] = {}

    def succeeded(self, broker: Broker, certificate: PeerCertificate) -> None:
        """A handshake with ``broker`` completed with ``certificate``."""
        record = self._record(broker)
        record.certificate = certificate
        record.handshake_at = time.time()
        record.handshakes += 1
        if self._logged.get(broker.label) is not None:
            log.info(
                "broker %s: TLS works again: %s, %s, certificate %s, expires %s",
                broker.label,
                certificate.version,
                certificate.cipher,
                certificate.subject,
                _iso(certificate.not_after),
                extra={"broker": broker.label},
            )
        self._logged[broker.label] = None

    def failed(self, broker: Broker, reason: str) -> None:
        """A TLS connect to ``broker`` failed for ``reason`` (one line)."""
        record = self._record(broker)
        record.error = reason
        record.error_at = time.time()
        record.failures += 1
        if self._logged.get(broker.label) != reason:
            log.warning("broker %s: %s", broker.label, reason, extra={"broker": broker.label})
            self._logged[broker.label] = reason

    def records(self) -> tuple[TlsRecord, ...]:
        """Every TLS broker's record, in configuration order."""
        return tuple(self._records.values())

    def get(self, label: str) -> TlsRecord | None:
        """The record of the broker labelled ``label`` (None: not a TLS broker)."""
        return self._records.get(label)

    def _record(self, broker: Broker) -> TlsRecord:
        record = self._records.get(broker.label)
        if record is None:
            record = self._records[broker.label] = TlsRecord(broker.label)
        return record


def server_name(broker: Broker, config: Config) -> str:
    """The name sent in SNI and checked against the certificate: the broker's ``sniHost``,
    else ``tls_server_name``, else the URL's host (an IP literal is checked against the
    certificate's IP addresses and sent without SNI, RFC 6066 §3)."""
    return broker.server_name or config.tls_server_name or broker.host


def client_context(broker: Broker, config: Config) -> ssl.SSLContext:
    """A fresh client context for ``broker``: trust, client certificate, hostname check,
    minimum version and ciphers from ``config`` (``broker.verify_hostname`` overrides
    ``tls_verify_hostname``). Reads the PEM files now.

    Raises:
        TlsFailed: a file is missing, unreadable or not PEM of the right kind, the key does
            not match the certificate, or its password is wrong; the message names the
            option and the file.
    """
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.tls_ca_file)
    except FileNotFoundError:
        raise TlsFailed(f"TLS: tls_ca_file {config.tls_ca_file}: no such file") from None
    except (OSError, ssl.SSLError) as exc:
        raise TlsFailed(
            f"TLS: tls_ca_file {config.tls_ca_file}: not a PEM CA bundle ({_brief(exc)})"
        ) from None
    verify = broker.verify_hostname
    context.check_hostname = config.tls_verify_hostname if verify is None else verify
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = _VERSIONS.get(config.tls_min_version, ssl.TLSVersion.TLSv1_2)
    if config.tls_ciphers:
        context.set_ciphers(config.tls_ciphers)  # checked when the config was loaded
    if config.tls_cert_file:
        password = _read_password(config.tls_key_password_file)
        try:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file, password)
        except FileNotFoundError as exc:
            raise TlsFailed(f"TLS: {_which(config, exc.filename)}: no such file") from None
        except (OSError, ssl.SSLError) as exc:
            raise TlsFailed(
                f"TLS: tls_cert_file {config.tls_cert_file} / tls_key_file "
                f"{config.tls_key_file}: cannot load the client certificate ({_brief(exc)})"
            ) from None
    return context


def _read_password(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.readline().rstrip(b"\r\n")
    except OSError as exc:
        raise TlsFailed(
            f"TLS: tls_key_password_file {path}: {exc.strerror or type(exc).__name__}"
        ) from None


def _which(config: Config, filename: object) -> str:
    for name in ("tls_cert_file", "tls_key_file"):
        if getattr(config, name) == filename:
            return f"{name} {filename}"
    return f"tls_cert_file {config.tls_cert_file}"


def _brief(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.replace("_", " ").lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class _Handshaken(Protocol):
    def getpeercert(self) -> dict[str, Any] | None: ...
    def cipher(self) -> tuple[str, str, int] | None: ...
    def version(self) -> str | None: ...


def peer_certificate(ssl_object: _Handshaken, name: str | None) -> PeerCertificate:
    """Read the verified peer certificate of a completed handshake (an ``ssl.SSLObject`` or
    a ``trio.SSLStream``, which forwards these methods)."""
    cert = ssl_object.getpeercert() or {}
    cipher = ssl_object.cipher()
    return PeerCertificate(
        subject=_rdn(cert.get("subject", ())),
        issuer=_rdn(cert.get("issuer", ())),
        not_before=_seconds(cert.get("notBefore")),
        not_after=_seconds(cert.get("notAfter")),
        names=tuple(f"{kind}:{value}" for kind, value in cert.get("subjectAltName", ())),
        version=ssl_object.version() or "",
        cipher=cipher[0] if cipher else "",
        server_name=name,
    )


def tls_failure(exc: BaseException, broker: Broker, config: Config | None) -> str | None:
    """The one-line reason of a TLS failure somewhere in ``exc``'s chain (``__cause__`` /
    ``__context__``: trio wraps ``ssl`` errors in ``BrokenResourceError``), or None when the
    failure was not TLS's. Certificate checks name what was wrong (OpenSSL's verify message:
    expired, not yet valid, unknown issuer, hostname mismatch) and what to look at."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TlsFailed):
            return str(current)
        if isinstance(current, ssl.SSLCertVerificationError):
            return _verify_reason(current, broker, config)
        if isinstance(current, ssl.SSLError):
            reason = current.reason or ""
            if reason in _REFUSED_CLIENT and config is not None and not config.tls_cert_file:
                # We sent no certificate: ActiveMQ answers bad_certificate (measured),
                # RabbitMQ certificate_required under TLS 1.3, handshake_failure under 1.2.
                reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
            words = _ALERTS.get(reason) or (reason.replace("_", " ").lower() or _brief(current))
            return f"TLS handshake failed: {words}"
        current = current.__cause__ or current.__context__
    return None


def _verify_reason(exc: ssl.SSLCertVerificationError, broker: Broker, config: Config | None) -> str:
    message = exc.verify_message or _brief(exc)
    code = exc.verify_code
    ca_file = config.tls_ca_file if config is not None else None
    if code in (2, 19, 20, 21):  # unknown issuer / self-signed in chain / no local issuer
        trusted = f"tls_ca_file {ca_file}" if ca_file else "the system store"
        hint = f"not signed by a CA in {trusted}"
    elif code in (62, 64):  # hostname / IP address mismatch
        name = server_name(broker, config) if config is not None else broker.host
        hint = (
            f"the certificate does not name {name!r} "
            "(tls_server_name or ?sniHost= for an alias, ?verifyHost=false to skip)"
        )
    elif code == 10:
        hint = "the broker's certificate has expired"
    elif code == 9:
        hint = "the broker's certificate is not valid yet (clock skew?)"
    else:
        hint = ""
    return f"TLS: broker certificate refused: {message}" + (f" ({hint})" if hint else "")


#: The reasons of the two one-sided configurations, once diagnosed.
PLAIN_PORT = (
    "TLS handshake failed: the broker answered in plain STOMP: this is not a TLS port "
    "(use stomp:// for it)"
)
TLS_PORT = "the broker answered in TLS: this is a TLS port (use stomp+ssl:// for it)"
#: A TLS leg closed or reset after the handshake, before any byte came back.
SILENT_AFTER_HANDSHAKE = (
    "TLS: the broker closed the connection after the handshake without a word (the way a "
    "TLS 1.3 broker refuses a missing or untrusted client certificate: check tls_cert_file)"
)
#: How long a diagnosis (:func:`answers_tls`, :func:`answers_stomp`) may take: a listener
#: answers its first bytes in milliseconds; a hung broker must not slow the round much.
DIAGNOSIS_SECONDS = 0.5


async def answers_stomp(host: str, port: int) -> bool:
    """Whether ``host:port`` answers a plain STOMP ``CONNECT`` with ``CONNECTED`` or
    ``ERROR``: the diagnosis of a TLS handshake the broker closed or never answered (a
    ``stomp+ssl://`` URL pointing at a plain STOMP port; ActiveMQ closes without a word on a
    ClientHello). One extra connection, only on that failure; the caller bounds it in time.
    """
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        return False
    try:
        await stream.send_all(b"CONNECT\naccept-version:1.0,1.1,1.2\n\n\x00")
        head = b""
        while len(head) < 9:
            chunk = await stream.receive_some(64)
            if not chunk:
                break
            head += chunk
    except (OSError, trio.BrokenResourceError):
        return False
    finally:
        await trio.aclose_forcefully(stream)
    return head.lstrip(b"\r\n").startswith((b"CONNECTED", b"ERROR"))


async def answers_tls(host: str, port: int) -> bool:
    """Whether ``host:port`` answers a TLS ClientHello with a TLS record: the diagnosis of a
    plain connection that received nothing, closed, reset or silent (ActiveMQ's and
    RabbitMQ's TLS listeners read "CONNE" as a record header and wait for ~20 KB more). One
    extra connection, only on that failure; the caller bounds it in time. False for anything
    else.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only the record type of the answer is looked at
    outgoing = ssl.MemoryBIO()
    hello = context.wrap_bio(ssl.MemoryBIO(), outgoing)
    with contextlib.suppress(ssl.SSLWantReadError):
        hello.do_handshake()
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        return False
    try:
        await stream.send_all(outgoing.read())
        head = await stream.receive_some(5)
    except (OSError, trio.BrokenResourceError):
        return False
    finally:
        await trio.aclose_forcefully(stream)
    return looks_like_tls(head)


def looks_like_tls(head: bytes) -> bool:
    """Whether the first bytes a plain connection received are a TLS record (a handshake or
    an alert, RFC 8446 §5.1: content type 21/22, legacy version 3.x): a ``stomp://`` URL
    pointing at a TLS port."""
    return len(head) >= 2 and head[0] in (0x15, 0x16) and head[1] == 0x03


def _rdn(name: Iterable[Iterable[tuple[str, str]]]) -> str:
    return ", ".join(f"{_SHORT.get(k, k)}={v}" for rdn in name for k, v in rdn)


def _seconds(text: object) -> float:
    return float(ssl.cert_time_to_seconds(text)) if isinstance(text, str) else 0.0


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
