"""The STOMP codec: bytes to events (:mod:`._parser`) and frames to bytes (:mod:`._serializer`)."""

from __future__ import annotations

from ._parser import FrameParser
from ._serializer import HEARTBEAT_BYTES, serialize

__all__ = ["HEARTBEAT_BYTES", "FrameParser", "serialize"]
