"""What the app asked for: its CONNECT and DISCONNECT, and how the sidecar answered them."""

from __future__ import annotations

import trio

from protocol import Frame
from proxy.tracking.window import Entry

__all__ = ["AppRequests"]


class AppRequests:
    """The app's handshake frames, kept for a restore and for the goodbye.

    Attributes:
        connect: the app's CONNECT once accepted (its credentials and headers re-CONNECT a
            new leg), else None.
        authenticated: the app presented the sidecar's own ``client_login`` /
            ``client_passcode`` (False when none is configured): it may see every session's
            events on the control channel.
        connected_locally: the sidecar answered the app's CONNECT itself, no broker being up
            (outbox mode, docs/outbox.md); the first leg is then restored onto as after a
            reconnect.
        implicit_first: the app sent no CONNECT and its broker connects implicitly (RabbitMQ's
            ``stomp.implicit_connect``): the frame that opened the session, handled as the
            session's first (``connect`` is then an empty CONNECT, and the app gets no
            CONNECTED); None otherwise.
        disconnect_entry: the app's DISCONNECT in the confirmation window, once submitted.
        disconnected: set when the broker's RECEIPT for that DISCONNECT arrived.
    """

    __slots__ = (
        "authenticated",
        "connect",
        "connected_locally",
        "disconnect_entry",
        "disconnected",
        "implicit_first",
    )

    def __init__(self) -> None:
        self.connect: Frame | None = None
        self.authenticated = False
        self.connected_locally = False
        self.disconnect_entry: Entry | None = None
        self.disconnected = trio.Event()
        self.implicit_first: Frame | None = None
