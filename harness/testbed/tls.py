"""TLS listeners for the test brokers: the PEM files a listener needs, made from a ``trustme`` CA.

A :class:`TlsListener` names PEM files: the server's certificate chain and key, the CA that
client certificates must chain to, and whether a client certificate is required. Pass it as
``tls=`` to :class:`~testbed.ActiveMQ` (a ``stomp+ssl`` transport connector; the PEM files are
converted to PKCS12 key and trust stores with ``openssl``/``keytool`` at start) or
:class:`~testbed.RabbitMQ` (``stomp.listeners.ssl`` with ``ssl_options``). Both then expose
``tls_port`` and ``stomp_ssl_url``.

:func:`write_server_files` and :func:`write_client_files` issue certificates from a per-run
``trustme.CA`` into a directory, with the validity period and host names chosen by the test
(expired, not yet valid, wrong host name). ``trustme`` is imported by those two only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datetime

    import trustme

__all__ = ["TlsClientFiles", "TlsListener", "write_client_files", "write_server_files"]

#: Host names a server certificate is issued for by default: what tests connect to.
DEFAULT_HOSTNAMES: tuple[str, ...] = ("localhost", "127.0.0.1")


@dataclass(frozen=True, slots=True)
class TlsListener:
    """A broker's TLS STOMP listener: PEM paths and the client-certificate policy.

    ``cert_chain``: the server certificate followed by any intermediates (PEM).
    ``key``: the server certificate's private key (PEM, unencrypted; RSA or EC).
    ``client_ca``: PEM of the CA(s) client certificates must chain to; ``None``: the broker
    does not ask for client certificates. With a CA and ``require_client_cert=False`` the
    broker asks for a certificate and verifies one that is offered, but accepts clients
    without one (ActiveMQ ``transport.wantClientAuth``, RabbitMQ
    ``fail_if_no_peer_cert = false``). ``require_client_cert``: refuse clients without a
    valid certificate (ActiveMQ ``transport.needClientAuth``, RabbitMQ
    ``fail_if_no_peer_cert = true``); needs ``client_ca``.
    ``server_ca``: PEM of the CA that issued ``cert_chain``, for the clients' trust; the
    brokers do not read it.
    """

    cert_chain: Path
    key: Path
    client_ca: Path | None = None
    require_client_cert: bool = False
    server_ca: Path | None = None

    def __post_init__(self) -> None:
        if self.require_client_cert and self.client_ca is None:
            raise ValueError("require_client_cert=True needs client_ca (the CA to verify with)")


@dataclass(frozen=True, slots=True)
class TlsClientFiles:
    """A client certificate for mutual TLS: ``cert_chain`` and ``key`` (PEM), and ``ca``: the
    PEM of the CA that issued it (what a broker's ``client_ca`` must contain)."""

    cert_chain: Path
    key: Path
    ca: Path


def _issue(
    ca: trustme.CA,
    identities: tuple[str, ...],
    *,
    not_before: datetime.datetime | None,
    not_after: datetime.datetime | None,
    key_type: trustme.KeyType | None,
    directory: Path,
    name: str,
) -> tuple[Path, Path]:
    """Issue a leaf certificate; write ``NAME.pem`` (chain) and ``NAME.key`` (mode 0600)."""
    import trustme  # noqa: PLC0415 (only tests issue certificates: keep ``import testbed`` light)

    leaf = ca.issue_cert(
        *identities,
        not_before=not_before,
        not_after=not_after,
        key_type=trustme.KeyType.ECDSA if key_type is None else key_type,
    )
    chain = directory / f"{name}.pem"
    chain.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key = directory / f"{name}.key"
    key.touch(mode=0o600)
    key.chmod(0o600)
    leaf.private_key_pem.write_to_path(str(key))
    return chain, key


def _write_ca(ca: trustme.CA, directory: Path) -> Path:
    path = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


def write_server_files(
    ca: trustme.CA,
    directory: Path,
    *,
    hostnames: tuple[str, ...] = DEFAULT_HOSTNAMES,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    key_type: trustme.KeyType | None = None,
    client_ca: trustme.CA | None = None,
    require_client_cert: bool = False,
    name: str = "server",
) -> TlsListener:
    """Issue a server certificate from ``ca`` and write the PEM files into ``directory``.

    Files (``directory`` is created): ``NAME.pem`` (chain), ``NAME.key``, ``ca.pem`` (``ca``'s
    certificate; the listener's ``server_ca``) and, with ``client_ca``, ``client-ca.pem``.
    ``hostnames``: the subject alternative names (host names or IP addresses; pass another
    name for a wrong-host certificate). ``not_before``/``not_after``: the validity period
    (timezone-aware datetimes; trustme's default is from now to ~10 years on), for expired or
    not-yet-valid certificates. ``key_type``: the server key's type (default ECDSA P-256;
    both brokers accept it and RSA-2048). ``client_ca``: the CA client certificates must
    chain to (may be ``ca`` itself); ``None``: no client certificates. ``require_client_cert``
    as in :class:`TlsListener`. Returns the :class:`TlsListener`.
    """
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    chain, key = _issue(
        ca,
        hostnames,
        not_before=not_before,
        not_after=not_after,
        key_type=key_type,
        directory=directory,
        name=name,
    )
    server_ca = _write_ca(ca, directory)
    client_ca_path: Path | None = None
    if client_ca is not None:
        client_ca_path = directory / "client-ca.pem"
        client_ca.cert_pem.write_to_path(str(client_ca_path))
    return TlsListener(
        cert_chain=chain,
        key=key,
        client_ca=client_ca_path,
        require_client_cert=require_client_cert,
        server_ca=server_ca,
    )


def write_client_files(
    ca: trustme.CA,
    directory: Path,
    *,
    name: str = "client",
    identities: tuple[str, ...] = ("client",),
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    key_type: trustme.KeyType | None = None,
) -> TlsClientFiles:
    """Issue a client certificate from ``ca`` into ``directory``: ``NAME.pem`` (chain),
    ``NAME.key`` and ``NAME-ca.pem`` (``ca``'s certificate). ``identities`` become the
    subject alternative names (trustme needs at least one); validity and key type as in
    :func:`write_server_files`."""
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    chain, key = _issue(
        ca,
        identities,
        not_before=not_before,
        not_after=not_after,
        key_type=key_type,
        directory=directory,
        name=name,
    )
    ca_path = directory / f"{name}-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    return TlsClientFiles(cert_chain=chain, key=key, ca=ca_path)
