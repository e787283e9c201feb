"""The broker's own answer to what an app sends before a session exists: a frame before
CONNECT, or a CONNECT whose versions the sidecar does not speak. Brokers answer those with an
ERROR of their own words (ActiveMQ: ``Not connected.``, RabbitMQ: ``You must log in using
CONNECT first``; measured); the sidecar asks the broker rather than inventing its own text.
"""

from __future__ import annotations

import trio

import protocol
from protocol import Frame
from proxy.legs.opening import StreamOpener
from proxy.legs.stream import FrameStream, TransportLost
from proxy.reconnect.brokers import in_force
from proxy.session.core import SessionCore, log

__all__ = ["broker_verdict"]


async def broker_verdict(
    core: SessionCore, frame: Frame, open_stream: StreamOpener
) -> Frame | None:
    """Send ``frame`` as the first frame of a new connection to the first broker of the list
    that accepts one, and return the frame it answers with (an ERROR, as a rule), or None when
    no broker answers within ``connect_timeout`` (each). The connection is closed after.

    Raises nothing for a broker that fails; cancellation propagates.
    """
    timeout = core.durations.connect_timeout
    data = protocol.serialize(frame, "1.0")  # before CONNECTED a frame is read as STOMP 1.0
    for broker in in_force(core.brokers):
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(timeout):
                stream = await open_stream(broker)
                wire = FrameStream(
                    stream,
                    protocol.Connection(protocol.Role.CLIENT, core.upstream_limits),
                    grace=2.0,
                )
                await stream.send_all(data)
                while True:
                    event = await wire.receive_event()
                    if isinstance(event, Frame):
                        return event
                    if isinstance(event, protocol.ConnectionClosed):
                        break
        except (OSError, trio.TooSlowError, TransportLost, protocol.ProtocolError) as exc:
            log.debug(
                "session %s: asking %s about %s: %s", core.id, broker.label, frame.command, exc
            )
        finally:
            if stream is not None:
                await trio.aclose_forcefully(stream)
    return None
