"""Seeded generators of hostile byte streams: STOMP sessions (valid, mutated, oversized, slow,
cut short) and HTTP requests, as data only (no I/O).

Everything here is a pure function of a :class:`random.Random`, so a stream is reproduced from
its seed and case number alone (:func:`case_rng`): ``python -m tests.fuzz.run --seed 1
--replay 1234`` prints case 1234 again. The same functions feed the hypothesis properties (with
``st.randoms()``, so hypothesis can shrink what they draw), the atheris seed corpus and the
socket fuzzers in :mod:`tests.fuzz.driver`.

Shapes: a :class:`Case` is a list of :class:`Part` (bytes, optionally repeated, sent in
chunks, then a pause), an ending (``fin``: half-close and wait for the server to close;
``rst``: abort with SO_LINGER 0; ``hold``: keep the connection open and wait for the server to
close it) and an :class:`Expect` (what the server must answer). Sizes are bytes, times seconds.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from protocol import VERSIONS, Command, Frame, serialize

__all__ = [
    "SPECIAL_TOKENS",
    "Case",
    "Expect",
    "Part",
    "Scale",
    "Script",
    "StompLimits",
    "case_rng",
    "client_script",
    "garbage",
    "http_case",
    "http_request",
    "mutate",
    "server_script",
    "soup",
    "stomp_case",
]

#: Byte strings that matter to a STOMP parser (and a few that matter to HTTP); mutations and
#: token soups insert them.
SPECIAL_TOKENS: tuple[bytes, ...] = (
    b"\x00",
    b":",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"\r\n\r\n",
    b"\\",
    b"\\c",
    b"\\n",
    b"\\r",
    b"\\t",
    b"content-length:",
    b"content-length:0\n",
    b"content-length:5\n",
    b"content-length:-1\n",
    b"content-length:99999999999\n",
    b"\xff",
    b"\xc3",
    b"\xc3\xa9",
    b"\xed\xa0\x80",  # an encoded surrogate: not UTF-8
    b"SEND\n",
    b"CONNECT\n",
    b"STOMP\n",
    b"DISCONNECT\n",
    b"accept-version:1.2\n",
    b"accept-version:9.9\n",
    b"heart-beat:1,1\n",
    b"heart-beat:x\n",
    b"receipt:r\n",
    b"destination:/topic/x\n",
    b"transaction:t\n",
    b"id:0\n",
    b"ack:client\n",
    b" ",
    b"\t",
    b"HTTP/1.1",
    b"GET / HTTP/1.1\r\n",
    b"Host: x\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: 10\r\n",
    b"0\r\n\r\n",
)

_COMMAND_NAMES = tuple(c.value.encode() for c in Command)


def case_rng(seed: int, index: int) -> random.Random:
    """The generator of case ``index`` of run ``seed`` (independent of every other case)."""
    return random.Random(f"mq-sidecar-fuzz:{seed}:{index}")


def garbage(rng: random.Random, max_len: int) -> bytes:
    """Uniformly random bytes, 0..``max_len`` of them."""
    return rng.randbytes(rng.randint(0, max_len))


def soup(rng: random.Random, count: int) -> bytes:
    """``count`` tokens: STOMP/HTTP specials, command names, letters and digits."""
    pool = (*SPECIAL_TOKENS, *_COMMAND_NAMES, b"a", b"b", b"x", b"1", b"0", b"-", b"/")
    return b"".join(rng.choice(pool) for _ in range(count))


# -- mutations --------------------------------------------------------------------------------


def _offset(rng: random.Random, data: bytearray) -> int:
    return rng.randrange(len(data) + 1)


def _flip_bit(rng: random.Random, data: bytearray) -> None:
    if data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)


def _random_byte(rng: random.Random, data: bytearray) -> None:
    if data:
        data[rng.randrange(len(data))] = rng.randrange(256)


def _delete_range(rng: random.Random, data: bytearray) -> None:
    if data:
        start = rng.randrange(len(data))
        del data[start : start + rng.choice((1, 1, 2, 5, 20, 200))]


def _duplicate_range(rng: random.Random, data: bytearray) -> None:
    if data:
        start = rng.randrange(len(data))
        piece = data[start : start + rng.choice((1, 3, 10, 100, 1000))]
        at = _offset(rng, data)
        data[at:at] = piece * rng.choice((1, 2, 3))


def _insert_token(rng: random.Random, data: bytearray) -> None:
    at = _offset(rng, data)
    data[at:at] = rng.choice(SPECIAL_TOKENS)


def _special_positions(data: bytearray) -> list[int]:
    return [i for i, b in enumerate(data) if b in b"\x00:\n\r\\"]


def _remove_special(rng: random.Random, data: bytearray) -> None:
    """Remove one NUL, colon, EOL byte or backslash."""
    positions = _special_positions(data)
    if positions:
        del data[rng.choice(positions)]


def _duplicate_special(rng: random.Random, data: bytearray) -> None:
    """Double one NUL, colon, EOL byte or backslash."""
    positions = _special_positions(data)
    if positions:
        at = rng.choice(positions)
        data[at:at] = data[at : at + 1]


def _truncate(rng: random.Random, data: bytearray) -> None:
    if data:
        del data[rng.randrange(len(data)) :]


def _long_run(rng: random.Random, data: bytearray) -> None:
    """Insert a long run of one byte (a header value or line far beyond the usual)."""
    at = _offset(rng, data)
    data[at:at] = rng.choice(b"ax:\n\\\x00 ").to_bytes(1, "big") * rng.choice((300, 5000, 20000))


def _lie_content_length(rng: random.Random, data: bytearray) -> None:
    """Give the first ``content-length`` (or a new one) a value that is not the body size."""
    value = rng.choice(
        (
            *(b"0", b"1", b"2", b"7", b"100", b"65536", b"1" + b"0" * 9, b"1" + b"0" * 20),
            *(b"9" * 5000, b"0" * 5000 + b"3"),  # beyond int()'s 4300-digit limit
        )
    )
    key = b"content-length:"
    at = data.find(key)
    if at < 0:
        lf = data.find(b"\n")
        if lf < 0:
            return
        data[lf + 1 : lf + 1] = key + value + b"\n"
        return
    end = data.find(b"\n", at)
    end = len(data) if end < 0 else end
    data[at + len(key) : end] = value


def _swap_ranges(rng: random.Random, data: bytearray) -> None:
    if len(data) >= 4:
        a, b = sorted(rng.sample(range(len(data)), 2))
        size = rng.randint(1, min(64, b - a))
        first, second = bytes(data[a : a + size]), bytes(data[b : b + size])
        data[b : b + size] = first
        data[a : a + size] = second


def _change_case(rng: random.Random, data: bytearray) -> None:
    if data:
        i = rng.randrange(len(data))
        data[i : i + 1] = bytes(data[i : i + 1]).swapcase()


_MUTATIONS: tuple[Callable[[random.Random, bytearray], None], ...] = (
    _flip_bit,
    _random_byte,
    _delete_range,
    _duplicate_range,
    _insert_token,
    _insert_token,
    _remove_special,
    _remove_special,
    _duplicate_special,
    _duplicate_special,
    _truncate,
    _long_run,
    _lie_content_length,
    _swap_ranges,
    _change_case,
)


def mutate(data: bytes, rng: random.Random, count: int | None = None) -> bytes:
    """``data`` after ``count`` (default 1..8) random mutations: bit flips, random bytes,
    deleted, duplicated or swapped ranges, inserted STOMP/HTTP tokens, removed or doubled
    NULs/colons/EOLs/backslashes, truncation, long runs of one byte, ``content-length`` lies,
    case changes."""
    out = bytearray(data)
    for _ in range(count if count is not None else rng.randint(1, 8)):
        rng.choice(_MUTATIONS)(rng, out)
    return bytes(out)


# -- valid STOMP sessions ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Script:
    """A valid STOMP session as bytes: ``frames[0]`` is the CONNECT (or STOMP, CONNECTED for
    a server script), the rest are serialized in ``version``; ``receipts`` are the receipt ids
    requested, in order (the last one is the DISCONNECT's for a client script)."""

    version: str
    frames: tuple[bytes, ...]
    receipts: tuple[str, ...] = ()

    @property
    def data(self) -> bytes:
        """All frames, concatenated."""
        return b"".join(self.frames)


#: Header text that needs escaping in 1.1/1.2 (and what 1.0 can carry: no CR, LF; no ':' in names).
_ESCAPY = (":", "\\", "\n", "\r", "é", "\u2603", " ", "a", "b", "0")


def _text(rng: random.Random, version: str, *, name: bool, size: int = 8) -> str:
    chars = _ESCAPY if version != "1.0" else ("é", " ", "a", "b", "0", "\\", "-")
    if version == "1.0" and not name:
        chars = (*chars, ":")
    text = "".join(rng.choice(chars) for _ in range(rng.randint(0 if not name else 1, size)))
    if version == "1.1":
        text = text.rstrip("\r")  # 1.1 cannot carry a trailing CR
    return text or "x"


def _body(rng: random.Random, max_len: int) -> bytes:
    kind = rng.random()
    if kind < 0.3:
        return b""
    if kind < 0.8:
        return rng.choice((b"hello", b"{}", "é".encode())) * rng.randint(1, max(1, max_len // 8))
    return rng.randbytes(rng.randint(1, max_len))  # may hold NULs: serialize adds content-length


def client_script(
    rng: random.Random,
    *,
    version: str | None = None,
    destinations: Sequence[str] = ("/topic/mq-sidecar-fuzz.a", "/topic/mq-sidecar-fuzz.b"),
    max_frames: int = 8,
    max_body: int = 512,
    heartbeat: bool = True,
) -> Script:
    """A valid client session: CONNECT (or STOMP), up to ``max_frames`` SUBSCRIBE, SEND,
    BEGIN/COMMIT/ABORT, UNSUBSCRIBE frames (some with receipts, headers that need escaping,
    binary bodies), then DISCONNECT with a receipt.

    No ACK/NACK: a valid one needs a message id from the server. ``heartbeat`` may offer
    ``heart-beat:0,0`` or omit it; never a beat the peer would then expect from us.
    """
    version = version or rng.choice(VERSIONS)
    accept = {
        "1.0": rng.choice((None, "1.0")),
        "1.1": rng.choice(("1.1", "1.0,1.1")),
        "1.2": rng.choice(("1.2", "1.0,1.1,1.2", "1.1,1.2")),
    }[version]
    headers: list[tuple[str, str]] = []
    if accept is not None:
        headers.append(("accept-version", accept))
    headers.append(("host", "/"))
    if heartbeat and rng.random() < 0.5:
        headers.append(("heart-beat", "0,0"))
    if rng.random() < 0.3:
        headers.append(("client-id", f"fuzz-{rng.randrange(10**6)}"))
    command = Command.STOMP if version != "1.0" and rng.random() < 0.3 else Command.CONNECT
    frames = [serialize(Frame(command, tuple(headers)), "1.0")]
    receipts: list[str] = []
    subscriptions: list[tuple[str, str]] = []
    transactions: list[str] = []
    for n in range(rng.randint(0, max_frames)):
        receipt: str | None = f"r{n}" if rng.random() < 0.4 else None
        op = rng.random()
        extra = (
            [(f"x-{_text(rng, version, name=True)}", _text(rng, version, name=False))]
            if rng.random() < 0.3
            else []
        )
        if op < 0.2 and len(subscriptions) < 3:
            sub_id = f"s{n}"
            dest = rng.choice(destinations)
            frame = Frame(
                Command.SUBSCRIBE,
                (
                    ("id", sub_id),
                    ("destination", dest),
                    ("ack", rng.choice(("auto", "client", "client-individual"))),
                ),
            )
            subscriptions.append((sub_id, dest))
        elif op < 0.3 and subscriptions:
            sub_id, dest = subscriptions.pop(rng.randrange(len(subscriptions)))
            frame = Frame(Command.UNSUBSCRIBE, (("id", sub_id),))
        elif op < 0.4 and not transactions:
            transactions.append(f"t{n}")
            frame = Frame(Command.BEGIN, (("transaction", transactions[-1]),))
        elif op < 0.5 and transactions:
            frame = Frame(
                rng.choice((Command.COMMIT, Command.ABORT)),
                (("transaction", transactions.pop()),),
            )
        else:
            send_headers: list[tuple[str, str]] = [("destination", rng.choice(destinations))]
            if transactions and rng.random() < 0.5:
                send_headers.append(("transaction", transactions[-1]))
            if rng.random() < 0.2:
                send_headers.append(("content-type", "text/plain"))
            frame = Frame(Command.SEND, tuple(send_headers), _body(rng, max_body))
        headers_out = list(frame.headers) + extra
        if receipt is not None:
            headers_out.append(("receipt", receipt))
            receipts.append(receipt)
        frames.append(serialize(Frame(frame.command, tuple(headers_out), frame.body), version))
        if rng.random() < 0.2:
            frames.append(rng.choice((b"\n", b"\r\n", b"\n\n\n")))  # heart-beats between frames
    for tx in transactions:
        frames.append(serialize(Frame(Command.ABORT, (("transaction", tx),)), version))
    receipts.append("bye")
    frames.append(serialize(Frame(Command.DISCONNECT, (("receipt", "bye"),)), version))
    return Script(version, tuple(frames), tuple(receipts))


def server_script(rng: random.Random, *, version: str | None = None, max_frames: int = 8) -> Script:
    """A valid server side for a client that offered every version: CONNECTED (choosing
    ``version``), then MESSAGE, RECEIPT and ERROR frames in that version."""
    version = version or rng.choice(VERSIONS)
    headers: list[tuple[str, str]] = []
    if version != "1.0" or rng.random() < 0.5:
        headers.append(("version", version))
    if rng.random() < 0.5:
        headers.append(("heart-beat", rng.choice(("0,0", "1000,0", "0,5000", "10,10"))))
    headers += [("server", "fuzz/1.0"), ("session", f"s-{rng.randrange(1000)}")]
    frames = [serialize(Frame(Command.CONNECTED, tuple(headers)), "1.0")]
    for n in range(rng.randint(0, max_frames)):
        op = rng.random()
        if op < 0.6:
            frame = Frame(
                Command.MESSAGE,
                (
                    ("destination", "/queue/" + _text(rng, version, name=False)),
                    ("message-id", f"m{n}"),
                    ("subscription", "0"),
                    ("x-" + _text(rng, version, name=True), _text(rng, version, name=False)),
                ),
                _body(rng, 200),
            )
        elif op < 0.85:
            frame = Frame(Command.RECEIPT, (("receipt-id", f"r{n}"),))
        else:
            frame = Frame(Command.ERROR, (("message", "no"),), b"details\n")
        frames.append(serialize(frame, version))
        if rng.random() < 0.3:
            frames.append(b"\n")
    return Script(version, tuple(frames))


# -- socket fuzz cases ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Part:
    """``data * repeat`` sent in pieces of at most ``chunk`` bytes, then ``pause`` seconds."""

    data: bytes
    repeat: int = 1
    chunk: int = 65536
    pause: float = 0.0

    @property
    def size(self) -> int:
        """Bytes this part sends."""
        return len(self.data) * self.repeat

    def pieces(self) -> Iterator[bytes]:
        """The bytes to write, in order, each at most ``chunk`` long (or one unit)."""
        if self.repeat == 1:
            for i in range(0, len(self.data), self.chunk):
                yield self.data[i : i + self.chunk]
            return
        per = max(1, self.chunk // max(1, len(self.data)))
        block = self.data * per
        full, rest = divmod(self.repeat, per)
        for _ in range(full):
            yield block
        if rest:
            yield self.data * rest


@dataclass(frozen=True, slots=True)
class Expect:
    """What the server must do with a case.

    Attributes:
        connected: True: CONNECTED must come (STOMP); False: it must not; None: either.
        error: an ERROR whose ``message`` contains this must come, unless the server reset the
            connection (a close with our bytes unread is a TCP reset, which may overtake it);
            "" accepts any message. None: no requirement.
        no_error: no ERROR at all (a valid session).
        receipts: RECEIPTs that must come (STOMP).
        statuses: HTTP status codes of the responses, in order; a prefix of them may come if
            the server closes early on a bad request (HTTP).
        status_in: every HTTP response status must be one of these (empty: any).
        closed_within: after the case's last byte (and half-close for ``fin``), the server
            must close within this many seconds, or the case is a hang. None: not checked
            (``rst``: we closed ourselves).
    """

    connected: bool | None = None
    error: str | None = None
    no_error: bool = False
    receipts: tuple[str, ...] = ()
    statuses: tuple[int, ...] = ()
    status_in: frozenset[int] = frozenset()
    closed_within: float | None = 30.0


@dataclass(frozen=True, slots=True)
class Case:
    """One hostile (or control) connection: what to send, how to end, what must happen.

    ``fanout``: run the same case on this many connections at once (a connection storm).
    ``version``: the STOMP version the case speaks after CONNECTED (reading the answers).
    """

    index: int
    kind: str
    parts: tuple[Part, ...]
    end: str = "fin"  # fin | rst | hold
    expect: Expect = field(default_factory=Expect)
    fanout: int = 1
    version: str = "1.2"

    @property
    def size(self) -> int:
        """Bytes sent per connection."""
        return sum(p.size for p in self.parts)


@dataclass(frozen=True, slots=True)
class StompLimits:
    """The sidecar limits the oversized cases go beyond, and its ``handshake_timeout`` (s)."""

    max_frame_bytes: int = 16 * 1024 * 1024
    max_headers: int = 1000
    max_header_line_bytes: int = 10240
    handshake_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class Scale:
    """How big the heavy cases are. ``heartbeats``: EOLs in the heart-beat flood; ``tiny_sends``:
    SEND frames in the tiny-frame flood; ``storm``: connections of a connection storm."""

    heartbeats: int = 1_000_000
    tiny_sends: int = 10_000
    storm: int = 50


#: The STOMP case kinds and their weights (per 100 cases, roughly).
STOMP_KINDS: dict[str, float] = {
    "valid": 8,
    "slow_valid": 2,
    "mutated": 30,
    "garbage": 8,
    "garbage_after_connect": 8,
    "soup": 6,
    "giant_header_line": 4,
    "too_many_headers": 3,
    "giant_frame": 3,
    "content_length_lie": 5,
    "heartbeat_flood": 1,
    "tiny_frames": 1,
    "abrupt_close": 14,
    "storm": 1,
    "slowloris": 3,  # last: the first case after the warm-up (see tests.fuzz.driver)
}


def _connect_bytes(rng: random.Random, version: str) -> bytes:
    return client_script(rng, version=version, max_frames=0).frames[0]


def _chunked(rng: random.Random, data: bytes) -> tuple[Part, ...]:
    """``data`` in a few random pieces with short pauses (exercises partial reads)."""
    if len(data) < 2 or rng.random() < 0.5:
        return (Part(data),)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 4))))
    bounds = [0, *cuts, len(data)]
    return tuple(
        Part(data[a:b], pause=rng.choice((0.0, 0.0, 0.01, 0.05)))
        for a, b in itertools.pairwise(bounds)
    )


def _valid_expect(script: Script) -> Expect:
    return Expect(connected=True, no_error=True, receipts=script.receipts)


def stomp_case(
    rng: random.Random,
    index: int,
    *,
    limits: StompLimits = StompLimits(),
    scale: Scale = Scale(),
    destinations: Sequence[str] = ("/topic/mq-sidecar-fuzz.a", "/topic/mq-sidecar-fuzz.b"),
    void_destination: str = "/topic/mq-sidecar-fuzz.void",
    kind: str | None = None,
) -> Case:
    """Case ``index``: a kind drawn by :data:`STOMP_KINDS` weight (or ``kind``), then its bytes.

    Kinds: ``valid`` / ``slow_valid`` (control sessions that must succeed: CONNECTED, every
    receipt, no ERROR), ``mutated`` (a valid session after 1..8 :func:`mutate` steps),
    ``garbage`` / ``garbage_after_connect`` / ``soup`` (random bytes or tokens, before or after
    a valid CONNECT), ``giant_header_line`` / ``too_many_headers`` / ``giant_frame`` (beyond
    ``limits``: the ERROR must name the limit), ``content_length_lie``, ``heartbeat_flood``
    (``scale.heartbeats`` EOLs after CONNECT, then a receipted SEND), ``tiny_frames``
    (``scale.tiny_sends`` minimal SENDs), ``slowloris`` (a CONNECT trickled past
    ``handshake_timeout``), ``abrupt_close`` (a valid or mutated session cut at a random byte
    with a TCP reset), ``storm`` (``scale.storm`` connections at once, CONNECT then reset).
    """
    if kind is None:
        kinds = list(STOMP_KINDS)
        kind = rng.choices(kinds, weights=[STOMP_KINDS[k] for k in kinds])[0]
    version = rng.choice(VERSIONS)
    dest = tuple(destinations)
    hs = limits.handshake_timeout

    def script(max_frames: int = 8) -> Script:
        return client_script(rng, version=version, destinations=dest, max_frames=max_frames)

    if kind == "valid":
        s = script()
        return Case(index, kind, _chunked(rng, s.data), "fin", _valid_expect(s), version=version)
    if kind == "slow_valid":
        s = script(max_frames=3)
        parts = [Part(s.frames[0])]
        for frame in s.frames[1:]:
            step = max(1, len(frame) // rng.randint(2, 6))
            parts += [
                Part(frame[i : i + step], pause=rng.uniform(0.02, 0.15))
                for i in range(0, len(frame), step)
            ]
        return Case(index, kind, tuple(parts), "fin", _valid_expect(s), version=version)
    if kind == "mutated":
        s = script()
        data = mutate(s.data, rng)
        return Case(index, kind, _chunked(rng, data), rng.choice(("fin", "fin", "rst")))
    if kind == "garbage":
        return Case(
            index,
            kind,
            (Part(garbage(rng, 4096)),),
            "fin",
            Expect(connected=False),
        )
    if kind == "garbage_after_connect":
        connect = _connect_bytes(rng, version)
        noise = garbage(rng, 4096)
        return Case(index, kind, (Part(connect), Part(noise)), "fin", version=version)
    if kind == "soup":
        prefix = _connect_bytes(rng, version) if rng.random() < 0.5 else b""
        return Case(index, kind, (Part(prefix + soup(rng, rng.randint(1, 200))),), "fin")
    if kind == "giant_header_line":
        size = limits.max_header_line_bytes + rng.choice((1, 100, 50_000, 1_000_000))
        in_connect = rng.random() < 0.3
        head = b"CONNECT\naccept-version:1.2\nhost:/\n" if in_connect else b"SEND\n"
        parts = [Part(head + b"x-big:"), Part(b"v", repeat=size), Part(b"\n\nbody\x00")]
        if not in_connect:
            parts.insert(0, Part(_connect_bytes(rng, version)))
        return Case(
            index,
            kind,
            tuple(parts),
            "fin",
            Expect(connected=not in_connect, error="header line too long"),
            version=version,
        )
    if kind == "too_many_headers":
        count = limits.max_headers + rng.choice((1, 10, 5000))
        return Case(
            index,
            kind,
            (
                Part(_connect_bytes(rng, version)),
                Part(b"SEND\ndestination:" + dest[0].encode() + b"\n"),
                Part(b"h:v\n", repeat=count),
                Part(b"\nx\x00"),
            ),
            "fin",
            Expect(connected=True, error="too many headers"),
            version=version,
        )
    if kind == "giant_frame":
        head = b"SEND\ndestination:" + dest[0].encode() + b"\n"
        if rng.random() < 0.5:
            announced = limits.max_frame_bytes + rng.choice((1, 1000))
            parts = [Part(head + b"content-length:%d\n\n" % announced), Part(b"z", repeat=1000)]
        else:
            parts = [Part(head + b"\n"), Part(b"z", repeat=limits.max_frame_bytes + 1000)]
        return Case(
            index,
            kind,
            (Part(_connect_bytes(rng, version)), *parts, Part(b"\x00")),
            "fin",
            Expect(connected=True, error="frame too large"),
            version=version,
        )
    if kind == "content_length_lie":
        body = rng.randbytes(rng.randint(1, 300)).replace(b"\x00", b"")
        real = len(body)
        lie = rng.choice((0, max(0, real - 1), real // 2, real + 1, real + 100))
        if lie == real:
            lie += 1
        frame = b"SEND\ndestination:" + dest[0].encode() + b"\ncontent-length:%d\n\n" % lie + body
        frame += b"\x00" + serialize(Frame(Command.DISCONNECT, (("receipt", "bye"),)), version)
        return Case(
            index,
            kind,
            (Part(_connect_bytes(rng, version)), Part(frame)),
            "fin",
            Expect(connected=True),
            version=version,
        )
    if kind == "heartbeat_flood":
        eol = rng.choice((b"\n", b"\r\n"))
        tail = serialize(
            Frame(Command.SEND, (("destination", dest[0]), ("receipt", "after")), b"x"), version
        ) + serialize(Frame(Command.DISCONNECT, (("receipt", "bye"),)), version)
        return Case(
            index,
            kind,
            (Part(_connect_bytes(rng, version)), Part(eol, repeat=scale.heartbeats), Part(tail)),
            "fin",
            Expect(connected=True, no_error=True, receipts=("after", "bye")),
            version=version,
        )
    if kind == "tiny_frames":
        tiny = serialize(Frame(Command.SEND, (("destination", void_destination),)), version)
        tail = serialize(Frame(Command.DISCONNECT, (("receipt", "bye"),)), version)
        return Case(
            index,
            kind,
            (Part(_connect_bytes(rng, version)), Part(tiny, repeat=scale.tiny_sends), Part(tail)),
            "fin",
            Expect(connected=True, no_error=True, receipts=("bye",)),
            version=version,
        )
    if kind == "slowloris":
        connect = _connect_bytes(rng, version)
        if rng.random() < 0.5:
            connect = b"\n" * 200 + connect  # heart-beats before CONNECT don't buy time
        head = connect[:-1]  # never the NUL: the CONNECT must not complete
        step = max(1, len(head) // max(4, round(hs / 0.1) + 8))
        pieces = [head[i : i + step] for i in range(0, len(head), step)]
        trickle = tuple(Part(piece, pause=hs * 1.5 / len(pieces)) for piece in pieces)
        return Case(
            index,
            kind,
            trickle,
            "hold",
            Expect(connected=False, error="no CONNECT frame received", closed_within=hs + 30.0),
        )
    if kind == "abrupt_close":
        s = script()
        data = s.data if rng.random() < 0.5 else mutate(s.data, rng)
        cut = rng.randrange(len(data) + 1)
        return Case(index, kind, _chunked(rng, data[:cut]), "rst", Expect(closed_within=None))
    if kind == "storm":
        return Case(
            index,
            kind,
            (Part(_connect_bytes(rng, version), pause=rng.uniform(0.0, 0.5)),),
            "rst",
            Expect(closed_within=None),
            fanout=scale.storm,
            version=version,
        )
    raise ValueError(f"unknown STOMP case kind {kind!r}")


# -- HTTP -------------------------------------------------------------------------------------

_PATHS = ("/healthz", "/readyz", "/metrics", "/status", "/", "/nope", "/healthz?x=1", "*")


def http_request(
    rng: random.Random, *, method: str | None = None, path: str | None = None
) -> bytes:
    """One well-formed HTTP/1.1 request for the admin plane (GET or HEAD unless ``method``),
    with a few ordinary headers in random order."""
    method = method or rng.choice(("GET", "GET", "GET", "HEAD"))
    path = path or rng.choice(_PATHS[:5])
    headers = [b"Host: 127.0.0.1", b"User-Agent: fuzz/1"]
    if rng.random() < 0.3:
        headers.append(rng.choice((b"Accept: */*", b"Accept: application/openmetrics-text")))
    rng.shuffle(headers)
    return b"%s %s HTTP/1.1\r\n%s\r\n\r\n" % (method.encode(), path.encode(), b"\r\n".join(headers))


#: The HTTP case kinds and their weights. A storm holds more connections than the admin
#: plane's limit for up to a second, and everything else gets 503 meanwhile: rare.
HTTP_KINDS: dict[str, float] = {
    "valid": 10,
    "pipelined": 10,
    "mutated": 30,
    "garbage": 10,
    "huge_headers": 8,
    "huge_request_line": 4,
    "body": 5,
    "abrupt_close": 15,
    "events_reset": 3,
    "storm": 0.2,
    "slowloris": 2,  # last: the first case after the warm-up (see tests.fuzz.driver)
}


def http_case(
    rng: random.Random,
    index: int,
    *,
    max_header_bytes: int = 8192,
    request_timeout: float = 10.0,
    storm: int = 80,
    kind: str | None = None,
) -> Case:
    """Case ``index`` for the admin plane: ``valid`` (one GET/HEAD: 200, or 404 for an unknown
    path), ``pipelined`` (2..6 requests in one write: as many responses), ``mutated``,
    ``garbage``, ``huge_headers`` / ``huge_request_line`` (beyond ``max_header_bytes``: 431 or
    400), ``body`` (a POST with a body: 405 and close), ``abrupt_close`` (reset mid-request or
    just after it), ``slowloris`` (a request trickled past ``request_timeout``: 408),
    ``events_reset`` (``GET /events``, then a reset), ``storm`` (``storm`` connections at
    once, more than the admin plane's connection limit)."""
    if kind is None:
        kinds = list(HTTP_KINDS)
        kind = rng.choices(kinds, weights=[HTTP_KINDS[k] for k in kinds])[0]
    any_status = Expect(closed_within=request_timeout + 30.0)
    if kind == "valid":
        path = rng.choice(_PATHS)
        request = http_request(rng, path=path)
        # /readyz may say 503 (not ready); "/nope" and "*" are no endpoint.
        known = {"/readyz": (), "/nope": (404,), "*": (404,)}
        statuses = known.get(path, (200,))
        return Case(
            index,
            kind,
            (Part(request),),
            "fin",
            Expect(statuses=statuses, status_in=frozenset({200, 404, 503}), closed_within=30.0),
        )
    if kind == "pipelined":
        n = rng.randint(2, 6)
        requests = [
            http_request(rng, path=rng.choice(("/healthz", "/metrics", "/status")))
            for _ in range(n)
        ]
        return Case(
            index,
            kind,
            _chunked(rng, b"".join(requests)),
            "fin",
            Expect(statuses=(200,) * n, closed_within=30.0),
        )
    if kind == "mutated":
        base = b"".join(http_request(rng) for _ in range(rng.randint(1, 3)))
        return Case(
            index,
            kind,
            _chunked(rng, mutate(base, rng)),
            rng.choice(("fin", "fin", "rst")),
            any_status,
        )
    if kind == "garbage":
        return Case(index, kind, (Part(garbage(rng, 2048) or b"\x00"),), "fin", any_status)
    if kind == "huge_headers":
        size = max_header_bytes + rng.choice((1, 100, 10_000, 200_000))
        return Case(
            index,
            kind,
            (
                Part(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "),
                Part(b"a", repeat=size),
                Part(b"\r\n\r\n"),
            ),
            "fin",
            Expect(status_in=frozenset({431, 400}), closed_within=30.0),
        )
    if kind == "huge_request_line":
        size = max_header_bytes + rng.choice((1, 5000, 100_000))
        return Case(
            index,
            kind,
            (Part(b"GET /"), Part(b"p", repeat=size), Part(b" HTTP/1.1\r\nHost: x\r\n\r\n")),
            "fin",
            Expect(status_in=frozenset({431, 400, 404}), closed_within=30.0),
        )
    if kind == "body":
        body = rng.randbytes(rng.randint(1, 5000))
        request = (
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        return Case(
            index, kind, (Part(request),), "fin", Expect(statuses=(405,), closed_within=30.0)
        )
    if kind == "abrupt_close":
        request = b"".join(http_request(rng) for _ in range(rng.randint(1, 3)))
        cut = rng.randrange(len(request) + 1)
        return Case(index, kind, _chunked(rng, request[:cut]), "rst", Expect(closed_within=None))
    if kind == "slowloris":
        request = http_request(rng)
        steps = 12
        return Case(
            index,
            kind,
            tuple(
                Part(request[i : i + 2], pause=request_timeout * 1.3 / steps)
                for i in range(0, min(len(request) - 4, steps * 2), 2)
            ),
            "hold",
            Expect(status_in=frozenset({408}), closed_within=request_timeout + 30.0),
        )
    if kind == "events_reset":
        request = http_request(rng, method="GET", path="/events")
        return Case(
            index,
            kind,
            (Part(request, pause=rng.uniform(0.0, 0.5)),),
            "rst",
            Expect(closed_within=None),
        )
    if kind == "storm":
        return Case(
            index,
            kind,
            (Part(b"", pause=rng.uniform(0.2, 1.0)), Part(http_request(rng, path="/healthz"))),
            "fin",
            Expect(status_in=frozenset({200, 503}), closed_within=30.0),
            fanout=storm,
        )
    raise ValueError(f"unknown HTTP case kind {kind!r}")
