"""Heart-beat negotiation and deadline arithmetic (STOMP 1.2 "Heart-beating").

No clock is read here: callers pass ``now`` (float seconds from any monotonic origin, such as
``trio.current_time()``) and get deadlines back in the same time base. Intervals are int
milliseconds, as on the wire.
"""

from __future__ import annotations

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["HeartBeatTimer", "negotiate_heartbeat", "parse_heartbeat"]

#: More digits than this is not a heart-beat interval anyone means (10**15 ms is 31,000 years).
_MAX_DIGITS = 15


def parse_heartbeat(value: str | None) -> tuple[int, int]:
    """Parse a ``heart-beat`` header ``"cx,cy"`` (STOMP 1.2 "Heart-beating").

    Args:
        value: the header value, or None when the header is absent.

    Returns:
        ``(cx, cy)`` in milliseconds: the sender can send every ``cx`` ms and wants to receive
        every ``cy`` ms; 0 means "cannot" / "does not want". ``(0, 0)`` for None. Spaces or tabs
        around each number are tolerated.

    Raises:
        ValueError: not two comma-separated non-negative decimal integers; the message names
            the value.
    """
    if value is None:
        return (0, 0)
    parts = value.split(",")
    if len(parts) == 2:
        first, second = (part.strip(" \t") for part in parts)
        if all(p.isascii() and p.isdigit() and len(p) <= _MAX_DIGITS for p in (first, second)):
            return (int(first), int(second))
    raise ValueError(
        f"invalid heart-beat header {value!r}: expected two non-negative integers 'cx,cy' (ms)"
    )


def negotiate_heartbeat(local: tuple[int, int], remote: tuple[int, int]) -> tuple[int, int]:
    """Compute the heart-beat intervals of one side of a connection (STOMP 1.2 "Heart-beating").

    Args:
        local: ``(cx, cy)`` from OUR CONNECT/CONNECTED frame: we can send every ``cx`` ms and
            want to receive every ``cy`` ms.
        remote: ``(sx, sy)`` from the PEER's frame, in the peer's terms.

    Returns:
        ``(send_interval_ms, receive_interval_ms)``; 0 means none. We send every
        ``max(cx, sy)`` ms unless ``cx`` or ``sy`` is 0, and expect data every ``max(sx, cy)`` ms
        unless ``sx`` or ``cy`` is 0.

    Raises:
        ValueError: a negative interval.
    """
    cx, cy = local
    sx, sy = remote
    if min(cx, cy, sx, sy) < 0:
        raise ValueError(f"heart-beat intervals must be >= 0, not {local} / {remote}")
    send = 0 if cx == 0 or sy == 0 else max(cx, sy)
    receive = 0 if sx == 0 or cy == 0 else max(sx, cy)
    return (send, receive)


class HeartBeatTimer:
    """Deadlines for sending heart-beats and for declaring a silent peer dead.

    Args:
        send_interval_ms: negotiated send interval in ms (0 = we never need to send).
        receive_interval_ms: negotiated receive interval in ms (0 = never check the peer).
        now: current time in seconds (any monotonic origin); both "last" times start here.
        grace: tolerance factor; the peer is dead after ``receive_interval * grace`` of silence
            (STOMP 1.2 "Heart-beating": "to take into account network delays, ... tolerance").
        send_share: fraction of the send interval after which something is written, 0 < x <= 1
            (1: at the negotiated interval, as STOMP 1.2 describes; less leaves a margin for a
            peer that judges silence with no tolerance, and for a writer that runs late:
            sending more often than ``cx`` is allowed, ``cx`` is only "the smallest number of
            milliseconds between heart-beats that it can guarantee").

    Any bytes count, not only heart-beats: call :meth:`data_sent` after every write and
    :meth:`data_received` after every read.

    Raises:
        ValueError: a negative interval, a ``grace`` that is not greater than 0 or a
            ``send_share`` outside (0, 1].
    """

    __slots__ = ("_grace", "_last_received", "_last_sent", "_receive_s", "_send_s")

    def __init__(
        self,
        send_interval_ms: int,
        receive_interval_ms: int,
        now: float,
        *,
        grace: float = 2.0,
        send_share: float = 1.0,
    ) -> None:
        if send_interval_ms < 0 or receive_interval_ms < 0:
            raise ValueError(
                f"heart-beat intervals must be >= 0 ms, not {send_interval_ms}, "
                f"{receive_interval_ms}"
            )
        if not grace > 0:
            raise ValueError(f"grace must be > 0, not {grace}")
        if not 0 < send_share <= 1:
            raise ValueError(f"send_share must be > 0 and <= 1, not {send_share}")
        self._send_s = send_interval_ms / 1000 * send_share
        self._receive_s = receive_interval_ms / 1000
        self._grace = grace
        self._last_sent = now
        self._last_received = now

    @property
    def receive_interval_ms(self) -> int:
        """The receive interval silence is judged by, ms (0: never)."""
        return round(self._receive_s * 1000)

    def data_sent(self, now: float) -> None:
        """Record that bytes were written at ``now`` (seconds)."""
        self._last_sent = now

    def data_received(self, now: float) -> None:
        """Record that bytes were read at ``now`` (seconds)."""
        self._last_received = now

    def next_send_deadline(self) -> float | None:
        """When we must write something (a heart-beat if nothing else), in seconds.

        ``last_sent + send_interval * send_share``; None when the send interval is 0.
        """
        if not self._send_s:
            return None
        return self._last_sent + self._send_s

    def receive_deadline(self) -> float | None:
        """When a still-silent peer is dead, in seconds.

        ``last_received + receive_interval * grace``; None when the receive interval is 0.
        """
        if not self._receive_s:
            return None
        return self._last_received + self._receive_s * self._grace

    def send_due(self, now: float) -> bool:
        """True when ``now`` has reached :meth:`next_send_deadline` (never when it is None)."""
        deadline = self.next_send_deadline()
        return deadline is not None and now >= deadline

    def peer_dead(self, now: float) -> bool:
        """True when ``now`` has reached :meth:`receive_deadline` (never when it is None)."""
        deadline = self.receive_deadline()
        return deadline is not None and now >= deadline
