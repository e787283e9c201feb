"""The broker's own answer to what the sidecar does not judge and cannot forward on the
session's leg: a frame before CONNECT, a CONNECT whose versions the sidecar does not speak, a
frame whose command STOMP does not define. Brokers answer those with an ERROR of their own
words (ActiveMQ: ``Not connected.``, ``Unknown STOMP action: FROB``; RabbitMQ: ``You must log
in using CONNECT first``, ``Bad command``; measured), and some close the connection after it
(ActiveMQ after an unknown command) while others read on; and a broker may connect implicitly
(RabbitMQ's ``stomp.implicit_connect``). The sidecar asks the broker, on a connection of its
own, rather than inventing its own text, and learns which.

How it asks: the app's frame, as the app wrote it, is the first frame of the connection (or
the first after a CONNECT of the session's, for a frame of a connected session); when the
broker has answered it (or said nothing for :data:`ANSWER_WAIT`), a probe frame follows, a
``BEGIN`` with a receipt: a broker that reads on answers the probe (its RECEIPT, or an ERROR
when not connected) and keeps the connection open for :data:`CLOSE_WAIT` more, one that
closes after its answer does not (it may answer the probe first: the close comes a moment
after the ERROR on ActiveMQ). Frames are
read with a bare :class:`protocol.FrameParser` (no state machine: an ERROR before CONNECT and
a frame after it are what is asked for).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import trio

import protocol
from config import Broker
from protocol import Command, Frame
from proxy.legs.connect_frame import connect_frame
from proxy.legs.opening import StreamOpener
from proxy.reconnect.brokers import in_force
from proxy.session.core import SessionCore, log
from proxy.session.ending import Ending
from proxy.session.to_app import AppOutput
from proxy.telemetry.vocabulary import ClientErrorReason

__all__ = [
    "ANSWER_WAIT",
    "CLOSE_WAIT",
    "PROBE_RECEIPT",
    "Verdict",
    "answer_unknown_command",
    "broker_verdict",
]

#: The receipt id (and transaction name) of the probe frame sent after the app's.
PROBE_RECEIPT = "mq-sidecar-probe"
_PROBE = Frame(Command.BEGIN, (("transaction", PROBE_RECEIPT), ("receipt", PROBE_RECEIPT)))
#: How long the broker may take to answer the app's frame before the probe is sent anyway
#: (a frame the broker takes silently gets no answer), seconds.
ANSWER_WAIT = 1.0
#: How long the connection must stay open after the probe's answer for the broker to count
#: as reading on, seconds.
CLOSE_WAIT = 0.2
_READ_SIZE = 64 * 1024


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a broker did with one app frame on a connection of its own.

    Attributes:
        answer: the first frame it sent after the app's (an ERROR, as a rule); None when it
            sent none before answering the probe or closing.
        closed: it closed the connection after that answer, instead of reading on.
        implicit_connect: (asked with ``implicit``) the broker took a frame before CONNECT as
            opening the session (RabbitMQ's ``stomp.implicit_connect``): the app's frame was
            not sent, nothing else is known.
    """

    answer: Frame | None
    closed: bool
    implicit_connect: bool = False


async def broker_verdict(
    core: SessionCore,
    data: bytes,
    open_stream: StreamOpener,
    *,
    connected: bool = False,
    implicit: bool = False,
) -> Verdict | None:
    """Ask a broker what it does with ``data`` (one app frame, its bytes as the app wrote
    them): on a new connection, as its first frame, or, ``connected``, after a CONNECT of the
    session's (:func:`proxy.legs.connect_frame.connect_frame` for the app's CONNECT, without
    its ``client-id``, which the session's own leg holds); then the probe (module docstring).
    ``implicit`` (a frame before CONNECT): the probe goes first, and a broker that answers it
    with its RECEIPT connects implicitly: ``data`` is not sent (:attr:`Verdict.implicit_connect`).

    The broker asked is the session's current one first, then the others of the list in
    order, each within ``connect_timeout``; the connection is closed after.

    Returns:
        The :class:`Verdict` of the first broker that answers; None when none does (refused
        the CONNECT, unreachable, silent, garbled).

    Raises nothing for a broker that fails; cancellation propagates.
    """
    timeout = core.durations.connect_timeout
    current = core.leg.upstream.broker if core.leg.upstream is not None else None
    brokers: Sequence[Broker] = in_force(core.brokers)
    if current is not None:
        brokers = [current, *(b for b in brokers if b is not current)]
    for broker in brokers:
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(timeout):
                stream = await open_stream(broker)
                verdict = await _ask(
                    core, broker, stream, data, connected=connected, implicit=implicit
                )
            if verdict is not None:
                return verdict
        except (
            OSError,
            trio.TooSlowError,
            trio.BrokenResourceError,
            protocol.ProtocolError,
        ) as exc:
            log.debug("session %s: asking %s about a frame: %s", core.id, broker.label, exc)
        finally:
            if stream is not None:
                await trio.aclose_forcefully(stream)
    return None


async def _ask(
    core: SessionCore,
    broker: Broker,
    stream: trio.abc.Stream,
    data: bytes,
    *,
    connected: bool,
    implicit: bool,
) -> Verdict | None:
    """One broker's :class:`Verdict` on ``stream`` (None: it refused the session's CONNECT)."""
    parser = protocol.FrameParser(core.upstream_limits)

    async def next_frame() -> Frame | None:
        """The broker's next frame; None at EOF or reset (heart-beats skipped)."""
        while True:
            event = parser.next_event()
            if isinstance(event, Frame):
                return event
            if isinstance(event, protocol.ConnectionClosed):
                return None
            if isinstance(event, protocol.NeedData):
                try:
                    chunk = bytes(await stream.receive_some(_READ_SIZE))
                except trio.BrokenResourceError:
                    chunk = b""  # a reset after the answer: closed, as an EOF
                parser.receive_data(chunk)

    if connected:
        app_connect = core.asked.connect
        assert app_connect is not None
        connect = connect_frame(
            broker, core.config, heart_beat="0,0", app_connect=app_connect.without("client-id")
        )
        await stream.send_all(protocol.serialize(connect, "1.2"))  # CONNECT is never escaped
        answer = await next_frame()
        if answer is None or answer.command is not Command.CONNECTED:
            return None
        parser.version = answer.get("version") or "1.0"
    if implicit:
        await stream.send_all(protocol.serialize(_PROBE, "1.0"))
        answer = await next_frame()
        if answer is None:
            return None
        if answer.command is Command.RECEIPT and answer.get("receipt-id") == PROBE_RECEIPT:
            return Verdict(None, closed=False, implicit_connect=True)
    await stream.send_all(data)
    first: Frame | None = None
    with trio.move_on_after(ANSWER_WAIT):
        first = await next_frame()
        if first is None:
            return Verdict(None, closed=True)
    try:
        await stream.send_all(protocol.serialize(_PROBE, parser.version))
    except trio.BrokenResourceError:
        return Verdict(first, closed=True)
    after = await next_frame()
    if first is None and after is not None and after.get("receipt-id") != PROBE_RECEIPT:
        # Nothing came within ANSWER_WAIT, then the answer to the app's frame: the probe's
        # answer follows it.
        first, after = after, await next_frame()
    if after is None:
        return Verdict(first, closed=True)
    # A broker closing after its answer may have read the probe first (ActiveMQ closes a
    # moment after its ERROR): its EOF follows within CLOSE_WAIT.
    with trio.move_on_after(CLOSE_WAIT):
        while (more := await next_frame()) is not None:
            log.debug("session %s: the broker's verdict went on: %s", core.id, more.command)
        return Verdict(first, closed=True)
    return Verdict(first, closed=False)


async def answer_unknown_command(
    core: SessionCore, unknown: protocol.UnknownCommand, out: AppOutput, open_stream: StreamOpener
) -> bool:
    """Answer an app frame of a connected session whose command STOMP does not define with the
    broker's own answer (:func:`broker_verdict`, ``connected``; it cannot go on the session's
    leg, whose broker might close it), after the answers to the app's earlier frames (the
    broker answers in order; ``call_timeout`` at most; the caller has sent them upstream).
    The session goes on if the broker read on after its answer (RabbitMQ: ``Bad command``) and
    ends with that answer if it closed (ActiveMQ: ``Unknown STOMP action``); with no broker
    answering, it ends with the sidecar's own ERROR. True when the session ended."""
    window = core.flow.window
    with trio.move_on_after(core.durations.call_timeout):
        while any(e.app_receipt and not (e.answered or e.deferred) for e in window):
            await core.flow.window_change()
    verdict = await broker_verdict(core, unknown.data, open_stream, connected=True)
    answer = verdict.answer if verdict is not None else None
    if verdict is None or (answer is None and verdict.closed):
        core.end_for_app_protocol_error(unknown)
        return True
    core.metrics.client_protocol_error(ClientErrorReason.MALFORMED_FRAME)
    if verdict.closed:
        core.end(Ending(f"app sent {unknown}; the broker closed after it", app_error=answer))
        return True
    if answer is not None:
        await out.send(answer)
    return False
