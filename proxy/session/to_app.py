"""Writing to the app: frames are queued on the app's leg and written at the end of a burst;
a write that fails ends the session; a header the app's STOMP version cannot carry is dropped
(and logged) rather than the frame; after each write the sidecar's ACKs of the auto-acked
messages in it may go upstream (:mod:`proxy.session.acks`)."""

from __future__ import annotations

import contextlib

import trio

import protocol
from protocol import Command, Frame, RawFrame
from proxy.legs.stream import TransportLost
from proxy.session.acks import SidecarAcks
from proxy.session.core import SessionCore, log
from proxy.session.ending import Ending

__all__ = ["AppOutput", "representable"]


class AppOutput:
    """The app-bound half of one session's app leg (the reader is
    :class:`proxy.session.app_side.AppSide`)."""

    def __init__(self, core: SessionCore, acks: SidecarAcks) -> None:
        self.core = core
        self.acks = acks
        #: Outbox mode: ``(destination, mq-sidecar-id)`` of the auto subscriptions' messages
        #: queued for the app, handed to ``core.seen`` once a flush has written them (at most
        #: one burst: the relay flushes at the end of each, and after ``max_unacked`` ACKs).
        self.seen: list[tuple[str, str]] = []

    async def send(self, frame: Frame | RawFrame, *, flush: bool = True) -> None:
        """Write to the app; if the app is gone, end the session (and unwind the caller).
        A :class:`protocol.RawFrame` is written as its bytes (the fast lane).

        ``flush=False`` only queues the frame (the upstream relay flushes at the end of a
        burst, :meth:`flush`). An ERROR written here rejects one frame and keeps the session
        (``fatal=False``); the ERROR that ends a session is written by ``Session.run``.
        """
        core = self.core
        app = core.app
        try:
            app.queue(frame, fatal=frame.command is not Command.ERROR)
        except TransportLost as exc:
            core.end(Ending(f"app connection lost: {exc}"))
            await trio.lowlevel.checkpoint()  # raises Cancelled: end() cancelled our scope
        except protocol.LocalProtocolError:
            if isinstance(frame, RawFrame):
                frame = frame.to_frame()
            if app.conn.state in (protocol.State.ERROR, protocol.State.CLOSED):
                # The app broke the protocol (its next frame, already read ahead, or a frame
                # cut off by EOF while this relay handled a burst) or left: its connection
                # takes nothing but the ERROR that answers it, and the session ends.
                broke = core.app_broke
                if core.ending is None and broke is not None:
                    core.end_for_app_protocol_error(broke)
                elif core.ending is None:
                    core.end(Ending(f"app connection unusable ({app.conn.state.name})"))
                await trio.lowlevel.checkpoint()  # raises Cancelled: end() cancelled our scope
                return
            # A header the app's STOMP version cannot carry (a line break in STOMP 1.0, a
            # trailing CR in 1.1): drop those headers rather than the frame, and say so.
            assert core.state is not None
            cleaned = representable(frame, core.state.app_version)
            if cleaned == frame:
                raise  # not a header problem: a bug, reported as an internal error
            log.warning(
                "session %s: %s header(s) not representable in STOMP %s dropped: %s",
                core.id,
                frame.command,
                core.state.app_version,
                ", ".join(sorted({k for k, _ in frame.headers} - {k for k, _ in cleaned.headers})),
            )
            await self.send(cleaned, flush=flush)
            return
        if flush or app.needs_flush:
            await self.flush()

    async def flush(self) -> None:
        """Write what is queued for the app; then the sidecar's ACKs of the auto-acked
        messages in it may go upstream. If the app is gone, end the session (and unwind)."""
        core = self.core
        # Only the ACKs of messages queued before this call: the flush writes those.
        held = self.acks.take()
        seen, self.seen = self.seen, []
        upstream = core.leg.upstream
        try:
            await core.app.flush()
        except TransportLost as exc:
            core.end(Ending(f"app connection lost: {exc}"))
            await trio.lowlevel.checkpoint()  # raises Cancelled: end() cancelled our scope
        if seen and core.seen is not None:
            await core.seen.add(seen)  # the app has these messages now: persisted next
        if held and upstream is not None and upstream is core.leg.upstream:
            for ack in held:
                await self.acks.send(upstream, ack)

    async def send_quietly(self, frame: Frame) -> None:
        """Write ``frame`` now, ignoring a broken leg (the goodbye of a session that ends)."""
        with contextlib.suppress(TransportLost, protocol.LocalProtocolError):
            await self.core.app.send(frame)

    async def answer_locally(self, app_receipt: str | None) -> None:
        """RECEIPT for a frame whose effect the sidecar itself guarantees."""
        if app_receipt is not None:
            await self.send(Frame(Command.RECEIPT, (("receipt-id", app_receipt),)))


def representable(frame: Frame, version: str) -> Frame:
    """``frame`` without the headers STOMP ``version`` cannot carry: in 1.0 (no escaping) a
    line break anywhere or a colon in a name, in 1.1 a value ending in CR (1.1 has no ``\\r``
    escape, so it would read as a CRLF line end). STOMP 1.2 "Value Encoding"."""
    if version == "1.0":
        bad = {
            name
            for name, value in frame.headers
            if ":" in name or "\n" in name or "\r" in name or "\n" in value or "\r" in value
        }
    elif version == "1.1":
        bad = {name for name, value in frame.headers if value.endswith("\r")}
    else:
        return frame
    return frame.without(*bad)
