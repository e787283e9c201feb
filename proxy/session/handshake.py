"""The app's side of the handshake: read its CONNECT within ``handshake_timeout``, negotiate
its STOMP version, check its credentials when the sidecar has its own (``client_login``), and
build the CONNECTED it gets once a broker has accepted the session."""

from __future__ import annotations

import hmac
import logging

import trio

import protocol
from config import FailoverMode
from protocol import Command, ConnectionClosed, Frame
from proxy.session.core import SessionCore
from proxy.session.ending import Ending, error_frame
from proxy.tracking import SessionState
from proxy.upstream import Upstream
from proxy.vocabulary import ClientErrorReason
from proxy.wire import TransportLost

__all__ = ["SUPPORTED_VERSIONS", "accept_connect", "connected_frame"]

#: Versions the sidecar speaks on both legs (STOMP 1.0, 1.1, 1.2).
SUPPORTED_VERSIONS = protocol.VERSIONS


async def accept_connect(core: SessionCore) -> Frame | None:
    """Read and check the app's CONNECT; on success set ``core.state`` and ``core.connect``
    and return the frame; otherwise end the session (with the ERROR the app gets) and
    return None."""
    timeout = core.durations.handshake_timeout
    try:
        with trio.fail_after(timeout):
            while True:
                event = await core.app.receive_event()
                if isinstance(event, Frame):
                    connect = event
                    break
                if isinstance(event, ConnectionClosed):
                    core.end(Ending("app closed before CONNECT", disconnect_upstream=False))
                    return None
    except trio.TooSlowError:
        core.metrics.client_protocol_error(ClientErrorReason.HANDSHAKE_TIMEOUT)
        core.end(
            Ending(
                "no CONNECT from the app in time",
                app_error=error_frame(f"no CONNECT frame received within {timeout:g} s"),
            )
        )
        return None
    except protocol.RemoteProtocolError as exc:
        core.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
        core.end(Ending(f"bad CONNECT: {exc}", app_error=exc.error_frame))
        return None
    except TransportLost as exc:
        core.end(Ending(f"app connection lost before CONNECT: {exc}"))
        return None
    accept = connect.get("accept-version")
    version = protocol.negotiate_version(accept, SUPPORTED_VERSIONS)
    if version is None:
        core.metrics.client_protocol_error(ClientErrorReason.UNSUPPORTED_VERSION)
        supported = ",".join(SUPPORTED_VERSIONS)
        err = error_frame(
            f"unsupported STOMP version(s) {accept}; supported: {supported}"
        ).with_header("version", supported)
        core.end(Ending(f"unsupported versions {accept!r}", app_error=err))
        return None
    config = core.config
    if config.client_login is not None and not _credentials_ok(core, connect):
        core.metrics.client_protocol_error(ClientErrorReason.AUTH_FAILED)
        core.end(
            Ending(
                "app authentication failed",
                app_error=error_frame("access denied: bad login or passcode for mq-sidecar"),
                level=logging.WARNING,
            )
        )
        return None
    core.state = SessionState(
        core.id,
        version,
        max_subscriptions=config.max_subscriptions,
        max_unacked=config.max_unacked,
        transparent=config.failover_mode is FailoverMode.TRANSPARENT,
    )
    core.connect = connect
    return connect


def _credentials_ok(core: SessionCore, connect: Frame) -> bool:
    """The app's ``login``/``passcode`` are the sidecar's ``client_login``/
    ``client_passcode`` (compared in constant time)."""
    expected_login = core.config.client_login or ""
    secret = core.config.client_passcode
    expected_pass = secret.reveal() if secret is not None else ""
    login_ok = hmac.compare_digest((connect.get("login") or "").encode(), expected_login.encode())
    pass_ok = hmac.compare_digest((connect.get("passcode") or "").encode(), expected_pass.encode())
    return login_ok and pass_ok


def connected_frame(core: SessionCore, upstream: Upstream) -> Frame:
    """The CONNECTED the app gets once ``upstream`` accepted the session: the app's version
    and the sidecar's heart-beats (``client_heartbeat``; none for STOMP 1.0), the session id,
    and ``server`` naming the broker behind the sidecar."""
    assert core.state is not None
    version = core.state.app_version
    server = "mq-sidecar"
    broker_server = upstream.connected.get("server")
    if broker_server:
        server = f"mq-sidecar ({broker_server})"
    headers: list[tuple[str, str]] = []
    if version != "1.0":
        sx, sy = core.config.client_heartbeat
        headers += [("version", version), ("heart-beat", f"{sx},{sy}")]
    headers += [("session", core.id), ("server", server)]
    return Frame(Command.CONNECTED, tuple(headers))
