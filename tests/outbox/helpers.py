"""Shared helpers of the outbox tests: frames, and a clock to hand the store."""

from __future__ import annotations

from proxy.outbox import OutboxFrame


def frame(n: int, *, size: int = 100, destination: str = "/queue/orders") -> OutboxFrame:
    """A SEND's bytes of about ``size`` bytes, named ``id-<n>``; the body repeats a marker
    with ``n`` in it, so the frame can be found in the database file."""
    head = f"SEND\ndestination:{destination}\nmq-sidecar-id:id-{n}\n\n".encode()
    marker = f"<body {n:06d}>".encode()
    body = (marker * (size // len(marker) + 1))[: max(0, size - len(head) - 1)]
    return OutboxFrame(f"id-{n}", destination, head + body + b"\0")


class FakeClock:
    """A wall clock the test moves (seconds since the epoch)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
