"""The client actions of a differential scenario, and how each run renders them to bytes.

An action names a connection (``"p"``, ``"c"``...) and says what the app writes on it. It is
run-independent: ``{run}`` in a header value or raw bytes stands for the run's own token (its
destination prefix, client ids, subscription names), and a :class:`MsgRef` stands for a
header of a MESSAGE that connection got in that run (the ``ack`` or ``message-id`` an ACK
names). So the same action list runs against the broker and through the sidecar.

Writing on a connection that is not open yet opens it (TCP only); a frame before CONNECT is
just a first action that is not a CONNECT.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tests.differential.wire import WireFrame, encode

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "Action",
    "Blob",
    "Close",
    "Frame",
    "MsgRef",
    "Raw",
    "Republish",
    "RunContext",
    "Value",
    "connect",
    "render",
]


@dataclass(frozen=True)
class MsgRef:
    """The value of ``header`` of the ``index``-th MESSAGE (from 0) connection ``conn`` got in
    this run; ``""`` if there is none (the runs diverged before: reported already)."""

    conn: str
    index: int
    header: str = "ack"


@dataclass(frozen=True)
class Blob:
    """A deterministic body of ``size`` bytes: printable text, or any byte value (NULs
    included) when ``binary``."""

    size: int
    binary: bool = False
    seed: int = 0

    def data(self) -> bytes:
        block = hashlib.sha256(f"{self.seed}:{self.size}:{self.binary}".encode()).digest()
        if not self.binary:
            block = block.hex().encode()
        reps = self.size // len(block) + 1
        return (block * reps)[: self.size]

    def __repr__(self) -> str:
        return f"Blob({self.size}, binary={self.binary}, seed={self.seed})"


Value = str | MsgRef


@dataclass(frozen=True)
class Frame:
    """A frame the app writes: ``headers`` in order, repeats kept, values written as given
    (no escaping); ``content_length`` adds a correct one; ``eol`` for every line."""

    conn: str
    command: str
    headers: tuple[tuple[str, Value], ...] = ()
    body: bytes | Blob = b""
    content_length: bool = False
    eol: bytes = b"\n"

    def header(self, name: str) -> Value | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True)
class Republish:
    """SEND a copy of the ``index``-th MESSAGE connection ``source`` got: every header as the
    app received it (``message-id``, ``subscription``, ``ack``, ``destination``...), the
    same body (with ``content-length`` if it had one), but the headers named in ``drop``
    (RabbitMQ refuses ``message-id`` on SEND), plus ``extra`` headers (a receipt)."""

    conn: str
    source: str
    index: int
    extra: tuple[tuple[str, str], ...] = ()
    drop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Raw:
    """Bytes written as they are (``{run}`` replaced): malformed input, odd framing."""

    conn: str
    data: bytes


@dataclass(frozen=True)
class Close:
    """The app closes its socket without DISCONNECT."""

    conn: str


Action = Frame | Republish | Raw | Close


@dataclass
class RunContext:
    """What rendering needs from one run: its token and the MESSAGEs each connection got."""

    token: str
    messages: dict[str, list[WireFrame]] = field(default_factory=dict)

    def text(self, value: str) -> str:
        return value.replace("{run}", self.token)

    def value(self, value: Value) -> str:
        if isinstance(value, MsgRef):
            got = self.messages.get(value.conn, [])
            if value.index >= len(got):
                return ""
            return got[value.index].get(value.header) or ""
        return self.text(value)


def render(action: Frame | Republish | Raw, ctx: RunContext) -> bytes:
    """The bytes ``action`` writes in the run of ``ctx``."""
    if isinstance(action, Raw):
        return action.data.replace(b"{run}", ctx.token.encode())
    if isinstance(action, Republish):
        got = ctx.messages.get(action.source, [])
        if action.index >= len(got):
            return encode("SEND", [("receipt", v) for k, v in action.extra if k == "receipt"])
        msg = got[action.index]
        dropped = {"content-length", *action.drop}
        headers = [(k, v) for k, v in msg.headers if k not in dropped]
        headers += [(k, ctx.text(v)) for k, v in action.extra]
        has_length = msg.get("content-length") is not None
        return encode("SEND", headers, msg.body, content_length=has_length)
    headers = [(k, ctx.value(v)) for k, v in action.headers]
    body = action.body.data() if isinstance(action.body, Blob) else action.body
    return encode(
        action.command, headers, body, eol=action.eol, content_length=action.content_length
    )


def awaited(action: Action) -> str | None:
    """What the runner waits for after ``action`` (besides quiet): ``"CONNECTED"`` after a
    CONNECT/STOMP, the receipt id the action asked for, or None."""
    if isinstance(action, Frame):
        if action.command in ("CONNECT", "STOMP"):
            return "CONNECTED"
        receipt = action.header("receipt")
        return receipt if isinstance(receipt, str) else None
    if isinstance(action, Republish):
        return dict(action.extra).get("receipt")
    return None


def connect(
    conn: str,
    version: str | None = "1.2",
    *,
    host: str | None = "/",
    heart_beat: str | None = None,
    login: tuple[str, str] | None = None,
    client_id: str | None = None,
    body: bytes = b"",
    command: str = "CONNECT",
    extra: Sequence[tuple[str, str]] = (),
) -> Frame:
    """A CONNECT (``version`` None: a STOMP 1.0 client, no ``accept-version`` at all)."""
    headers: list[tuple[str, Value]] = []
    if version is not None:
        headers.append(("accept-version", version))
    if host is not None:
        headers.append(("host", host))
    if heart_beat is not None:
        headers.append(("heart-beat", heart_beat))
    if login is not None:
        headers += [("login", login[0]), ("passcode", login[1])]
    if client_id is not None:
        headers.append(("client-id", client_id))
    headers += list(extra)
    return Frame(conn, command, tuple(headers), body)
