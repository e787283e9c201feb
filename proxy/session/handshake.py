"""The app's side of the handshake: read its CONNECT within ``handshake_timeout``, negotiate
its STOMP version, check its credentials when the sidecar has its own (``client_login``), and
build the CONNECTED it gets once a broker has accepted the session.

What the sidecar does not judge gets the broker's own answer (:mod:`proxy.session.verdict`): a
frame before CONNECT (answered, and the connection kept or closed as the broker does; or, with
a broker that connects implicitly, the session opened by it), and a CONNECT offering no
version the sidecar speaks."""

from __future__ import annotations

import hmac
import logging

import trio

import protocol
from config import FailoverMode
from protocol import Command, ConnectionClosed, Frame
from proxy._version import VERSION
from proxy.legs.broker import Upstream
from proxy.legs.dialect import HeartBeatAnswer
from proxy.legs.opening import StreamOpener
from proxy.legs.stream import TransportLost
from proxy.session.core import SessionCore, log
from proxy.session.ending import Ending, error_frame
from proxy.session.verdict import broker_verdict
from proxy.telemetry.vocabulary import ClientErrorReason
from proxy.tracking import SessionState

__all__ = ["SUPPORTED_VERSIONS", "accept_connect", "connected_frame", "local_connected_frame"]

#: Versions the sidecar speaks on both legs (STOMP 1.0, 1.1, 1.2).
SUPPORTED_VERSIONS = protocol.VERSIONS
#: Frames before CONNECT answered (each with the broker's ERROR) before the session ends: an
#: app that never sends CONNECT costs a broker connection per frame, so this bounds it.
MAX_EARLY_FRAMES = 8
_CONNECT = (Command.CONNECT, Command.STOMP)


async def accept_connect(core: SessionCore, open_stream: StreamOpener) -> Frame | None:
    """Read and check the app's CONNECT; on success set ``core.state`` and ``core.asked.connect``
    and return the frame; otherwise end the session (with the ERROR the app gets) and
    return None. ``open_stream`` reaches the brokers asked for their verdicts."""
    timeout = core.durations.handshake_timeout
    early = 0
    try:
        with trio.fail_after(timeout):
            while True:
                try:
                    event = await core.app.receive_event()
                except protocol.UnknownCommand as exc:
                    early += 1
                    if not await _answer_early_frame(core, exc, open_stream, early):
                        return None
                    continue
                if isinstance(event, Frame):
                    if event.command in _CONNECT:
                        connect = event
                        break
                    early += 1
                    answered = await _answer_early_frame(core, event, open_stream, early)
                    if answered is None:  # the broker connects implicitly: so does the sidecar
                        core.asked.implicit_first = event
                        connect = Frame(Command.CONNECT)
                        break
                    if not answered:
                        return None
                elif isinstance(event, ConnectionClosed):
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
        verdict = await broker_verdict(core, protocol.serialize(connect, "1.0"), open_stream)
        answer = verdict.answer if verdict is not None else None
        if answer is None or answer.command is not Command.ERROR:
            supported = ",".join(SUPPORTED_VERSIONS)
            answer = error_frame(
                f"unsupported STOMP version(s) {accept}; supported: {supported}"
            ).with_header("version", supported)
        core.end(Ending(f"unsupported versions {accept!r}", app_error=answer))
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
    core.asked.authenticated = config.client_login is not None
    core.state = SessionState(
        core.id,
        version,
        max_subscriptions=config.max_subscriptions,
        max_unacked=config.max_unacked,
        id_cache_size=config.id_cache_size,
        transparent=config.failover_mode is FailoverMode.TRANSPARENT,
    )
    # Outbox mode: queue subscriptions persist the ids the app settles (issue 17 part 3).
    core.state.persist_seen_ids = core.seen is not None
    # What open transactions keep counts against max_memory_bytes too.
    core.state.transaction_bytes.process = core.flow.window.budget
    core.asked.connect = connect
    return connect


async def _answer_early_frame(
    core: SessionCore,
    frame: Frame | protocol.UnknownCommand,
    open_stream: StreamOpener,
    count: int,
) -> bool | None:
    """Answer a frame that came before CONNECT (or one whose command STOMP does not define)
    with the broker's verdict, keeping the connection as the broker does (False: the session
    ended instead: the broker closed after its answer, ActiveMQ after an unknown command).
    None: the broker connects implicitly (RabbitMQ with ``stomp.implicit_connect``; asked
    before the frame is sent, so that it takes effect once, on the session): the frame opens
    the session (docs/behaviour.md, "Transparency first")."""
    if count > MAX_EARLY_FRAMES:
        core.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
        core.end(
            Ending(
                f"{count} frames before CONNECT",
                app_error=error_frame(f"no CONNECT frame after {count - 1} other frames"),
            )
        )
        return False
    if isinstance(frame, Frame):
        command, receipt = str(frame.command), frame.get("receipt")
        data = protocol.serialize(frame, "1.0")  # before CONNECTED a frame is read as STOMP 1.0
    else:
        command, receipt, data = frame.command, frame.receipt, frame.data
    # Only the first frame can connect implicitly: the ones after it are the session's.
    implicit = isinstance(frame, Frame) and count == 1
    verdict = await broker_verdict(core, data, open_stream, implicit=implicit)
    if verdict is not None and verdict.implicit_connect:
        return None
    answer = verdict.answer if verdict is not None else None
    core.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
    if verdict is not None and answer is not None and verdict.closed:
        core.end(Ending(f"{command} before CONNECT, the broker closed", app_error=answer))
        return False
    if answer is None or answer.command is not Command.ERROR:
        log.info("session %s: %s before CONNECT, not refused by the broker", core.id, command)
        answer = error_frame(
            "mq-sidecar needs a CONNECT frame first",
            receipt_id=receipt,
            detail=f"{command} before CONNECT: a session starts with CONNECT (STOMP 1.2 "
            "'Connecting'); mq-sidecar does not connect implicitly.",
        )
    try:
        await core.app.send(answer, fatal=False)
    except TransportLost as exc:
        core.end(Ending(f"app connection lost before CONNECT: {exc}"))
        return False
    return True


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
    """The CONNECTED the app gets once ``upstream`` accepted the session: the app's version,
    the heart-beats that broker answers the app's ask with (:class:`HeartBeatAnswer`; the
    sidecar's ``client_heartbeat`` for a broker whose rule is not known), the session id, and
    ``server`` naming the broker behind the sidecar."""
    # The broker's own `server` (apps tell brokers apart by it, as the sidecar itself does);
    # the sidecar's name only when the broker gives none.
    server = upstream.connected.get("server") or f"mq-sidecar/{VERSION}"
    return _connected(core, server, upstream.dialect.heart_beat_answer)


def local_connected_frame(core: SessionCore) -> Frame:
    """The CONNECTED the sidecar answers itself when no broker answered the first round
    (outbox mode, docs/outbox.md): as :func:`connected_frame`, with ``server`` naming
    mq-sidecar (no broker is behind it yet) and the sidecar's ``client_heartbeat``."""
    server = f"mq-sidecar/{VERSION} (outbox; no broker connected yet)"
    return _connected(core, server, HeartBeatAnswer.UNKNOWN)


def _connected(core: SessionCore, server: str, rule: HeartBeatAnswer) -> Frame:
    assert core.state is not None
    assert core.asked.connect is not None
    version = core.state.app_version
    # The app's heart-beat header was checked when its CONNECT was read (protocol.Connection).
    ask = protocol.parse_heartbeat(core.asked.connect.get("heart-beat"))
    answer = rule.answer(ask)
    if answer is None:
        # STOMP 1.0 has no heart-beating, but ActiveMQ and RabbitMQ both answer a 1.0 client
        # with `version:1.0` and `heart-beat:0,0` (measured), and so does the sidecar.
        answer = core.config.client_heartbeat if version != "1.0" else (0, 0)
    sx, sy = answer
    headers: list[tuple[str, str]] = [("version", version), ("heart-beat", f"{sx},{sy}")]
    headers += [("session", core.id), ("server", server)]
    return Frame(Command.CONNECTED, tuple(headers))
