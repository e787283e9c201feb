"""The stored-frame format of the outbox: how a frame is kept on disk (STOMP 1.2 bytes, as
the session serialized it at append) and read back, and how many frames a forwarder reads at
once. Shared by a session's forwarding (:mod:`proxy.session.outbox`) and the outbox forwarder
(:mod:`proxy.outbox.forwarder`). No I/O."""

from __future__ import annotations

from collections.abc import Sequence

import protocol
from protocol import Frame
from proxy.outbox.records import StoredFrame

__all__ = ["FETCH_FRAMES", "STORED_VERSION", "FetchSize", "parse"]

#: Frames a forwarder reads from the outbox at once, at most (:class:`FetchSize`).
FETCH_FRAMES = 256
#: The STOMP version frames are stored in (each leg writes them in its own version).
STORED_VERSION = "1.2"
#: Bounds for reading a stored frame back: what a broker leg reads (the frame passed the app's
#: own limits when it was stored).
_READ_LIMITS = protocol.Limits(max_frame_bytes=1 << 31, max_headers=1 << 20)


def parse(data: bytes) -> Frame:
    """The frame stored as ``data`` (:data:`STORED_VERSION` bytes, as serialized at append).

    Raises:
        protocol.RemoteProtocolError: not one whole STOMP frame (the store checks each
            frame's CRC32 before it hands it out, so this means a bug, not a bad disk).
    """
    parser = protocol.FrameParser(_READ_LIMITS, version=STORED_VERSION)
    parser.receive_data(data)
    event = parser.next_event()
    if not isinstance(event, Frame):
        raise protocol.RemoteProtocolError(f"stored frame is incomplete ({len(data)} bytes)")
    return event


class FetchSize:
    """How many frames a forwarder reads from the outbox at once, so that a read holds about
    ``budget`` bytes (the confirmation window) whatever the frames' size: it starts at 1,
    doubles (up to :data:`FETCH_FRAMES`) after a full read of less than a quarter of the
    budget, halves after a read of more than the budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.frames = 1

    def update(self, frames: Sequence[StoredFrame]) -> None:
        """Adjust after a read that returned ``frames``."""
        size = sum(len(f.frame) for f in frames)
        if size > self.budget:
            self.frames = max(1, self.frames // 2)
        elif size < self.budget // 4 and len(frames) == self.frames:
            self.frames = min(FETCH_FRAMES, self.frames * 2)
