"""Opening the byte stream to a broker: TCP, TLS for ``stomp+ssl`` brokers, and, when a
connect fails, why in one line (a certificate refused, TLS on one side only, a plain port
behind a TLS URL...), probed within ``DIAGNOSIS_SECONDS``.

:class:`BrokerStreams` is the daemon's :data:`StreamOpener`; unit tests pass an opener of
their own that returns a memory stream to a scripted broker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from config import Broker, Config
from proxy.legs.tls import (
    CLOSED_IN_HANDSHAKE,
    DIAGNOSIS_SECONDS,
    PLAIN_PORT,
    SILENT_AFTER_HANDSHAKE,
    TLS_PORT,
    TlsFailed,
    TlsTracker,
    answers_stomp,
    answers_tls,
    client_context,
    looks_like_tls,
    peer_certificate,
    server_name,
    tls_failure,
)

if TYPE_CHECKING:
    from proxy.legs.stream import FrameStream

__all__ = ["BrokerStreams", "StreamOpener", "silence_reason", "tls_reason"]


#: Opens the byte stream to a broker: :class:`BrokerStreams` (TCP, and TLS for ``stomp+ssl``)
#: in the daemon; unit tests pass one that returns a memory stream to a scripted broker.
StreamOpener = Callable[[Broker], Awaitable[trio.abc.Stream]]


class BrokerStreams:
    """The daemon's :data:`StreamOpener` (call it with a broker): a TCP connection to
    ``broker.host:broker.port``, wrapped in TLS for a TLS broker with a context built from
    ``config`` at each call (:func:`proxy.legs.tls.client_context`: rotated files apply at the next
    connect). ``tracker`` keeps each TLS broker's certificate and last failure.

    Raises (from a call):
        OSError: the broker cannot be reached (refused, unreachable, name not resolved).
        proxy.legs.tls.TlsFailed: the TLS handshake or its files failed (one-line reason).
    """

    def __init__(self, config: Config, tracker: TlsTracker | None = None) -> None:
        self.config = config
        self.tracker = tracker if tracker is not None else TlsTracker(config.brokers)

    async def __call__(self, broker: Broker) -> trio.abc.Stream:
        # Names are resolved on every attempt: a Kubernetes Service may move
        # (docs/behaviour.md, "Broker list and reconnect policy").
        tcp = await trio.open_tcp_stream(broker.host, broker.port)
        if not broker.tls:
            return tcp
        name = server_name(broker, self.config)
        try:
            context = client_context(broker, self.config)
            tls = trio.SSLStream(tcp, context, server_hostname=name)
            await tls.do_handshake()
        except BaseException as exc:
            await trio.aclose_forcefully(tcp)
            reason = tls_failure(exc, broker, self.config)
            if reason is None or not isinstance(exc, Exception):
                raise
            if reason.endswith(CLOSED_IN_HANDSHAKE):
                with trio.move_on_after(DIAGNOSIS_SECONDS):
                    if await answers_stomp(broker.host, broker.port):
                        reason = PLAIN_PORT
            self.tracker.failed(broker, reason)
            raise TlsFailed(reason) from exc
        self.tracker.succeeded(broker, peer_certificate(tls, name))
        return tls

    def after_handshake(self, broker: Broker, reason: str) -> None:
        """A TLS failure that showed only after the handshake (TLS 1.3 sends the broker's
        "certificate required" alert with its first record), for the tracker."""
        self.tracker.failed(broker, reason)


async def tls_reason(
    exc: BaseException | None,
    broker: Broker,
    wire: FrameStream | None,
    open_stream: StreamOpener,
) -> str | None:
    """Why a connect failed, when TLS is why: an ``ssl`` error under ``exc`` (a TLS broker),
    or a TLS listener behind a plain URL: TLS records received, or the connection closed or
    reset before a byte arrived and the port answers a ClientHello (:func:`answers_tls`)."""
    if broker.tls:
        config = open_stream.config if isinstance(open_stream, BrokerStreams) else None
        reason = None if exc is None else tls_failure(exc, broker, config)
        if reason is None and wire is not None and wire.bytes_in == 0:
            # Under TLS 1.3 a broker refuses our certificate (or its absence) with an alert
            # after the handshake; the connection's reset can overtake that alert (a reset
            # discards what the kernel has not handed over yet).
            reason = SILENT_AFTER_HANDSHAKE
        if reason is not None and isinstance(open_stream, BrokerStreams):
            open_stream.after_handshake(broker, reason)
        return reason
    if wire is None or not isinstance(open_stream, BrokerStreams):
        return None
    if looks_like_tls(wire.head):
        return TLS_PORT
    return await silence_reason(broker, wire, open_stream)


async def silence_reason(
    broker: Broker, wire: FrameStream | None, open_stream: StreamOpener
) -> str | None:
    """When a broker said nothing (closed, reset or silent before a byte): whether the port
    speaks the other protocol than the URL says (:func:`proxy.legs.tls.answers_tls`,
    :func:`proxy.legs.tls.answers_stomp`), within ``DIAGNOSIS_SECONDS``; None otherwise."""
    if not isinstance(open_stream, BrokerStreams):
        return None
    if broker.tls:
        if wire is not None:  # the handshake completed: TLS it is
            return None
        with trio.move_on_after(DIAGNOSIS_SECONDS):
            if await answers_stomp(broker.host, broker.port):
                open_stream.after_handshake(broker, PLAIN_PORT)
                return PLAIN_PORT
        return None
    if wire is None or wire.bytes_in > 0 or wire.frames_out == 0:
        return None
    with trio.move_on_after(DIAGNOSIS_SECONDS):
        if await answers_tls(broker.host, broker.port):
            return TLS_PORT
    return None
