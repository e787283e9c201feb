"""Property tests of ``protocol/`` against hostile input (issue 7, "Fuzzing").

What ``tests/protocol/test_roundtrip.py`` already has (round trips of representable frames,
chunking invariance of the bare parser) is not repeated. Added here:

* any byte stream (random, token soup, valid sessions after random mutations) against the
  parser in every version and against :class:`protocol.Connection` in both roles, fresh and
  after a handshake in 1.0/1.1/1.2: events or :class:`~protocol.RemoteProtocolError`, never
  another exception, with every invariant of :mod:`tests.fuzz.checks` (bounded buffer, sticky
  errors, sendable ERROR frames, roles, monotonic states);
* every frame the parser accepts can be serialized again and reads back the same, except a
  header holding a CR where the version cannot carry one;
* chunking never changes what a Connection reads (it switches versions mid-buffer);
* unbounded streams in bounded memory: any prefix followed by a unit repeated without end
  either errors or keeps the buffer bounded; up to 100 MB of a header that never ends, a head
  that never ends, a body without NUL... trip their limit within one frame's worth, and
  endless heart-beats and tiny frames (2-3 MB by default, ``MQ_SIDECAR_FUZZ_MB=100`` for the
  issue's 100 MB) keep the buffer within a chunk, against the sidecar's default limits;
* regressions of the two protocol bugs these properties found (a Connection broken by a
  frame-level rule kept buffering; a ``content-length`` of more than 4300 digits raised
  ValueError);
* the atheris harness (:mod:`tests.fuzz.atheris_protocol`) runs a short coverage-guided
  session as a subprocess and exits 0.

Reproducible: ``derandomize=True`` (a fixed seed per test), ``deadline=None`` (a loaded CI
machine must not turn a slow example into a failure).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    NEED_DATA,
    VERSIONS,
    Connection,
    Frame,
    FrameParser,
    Limits,
    RemoteProtocolError,
    Role,
    UnknownCommand,
)
from tests.fuzz import streams
from tests.fuzz.checks import (
    PRELUDES,
    check_parser_buffer,
    handshake,
    pieces,
    run_connection,
    run_parser,
    serve_connect,
)

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: The sidecar's default limits (config/examples/mq-sidecar.toml), tiny ones that every
#: example runs into, and something in between.
SIDECAR_LIMITS = Limits()
SMALL = Limits(max_frame_bytes=256, max_headers=6, max_header_line_bytes=64)
LIMITS = st.sampled_from([SIDECAR_LIMITS, SMALL, Limits(4096, 40, 512)])
CHUNKS = st.lists(st.integers(1, 16) | st.integers(17, 5000), min_size=1, max_size=6)
RANDOMS = st.randoms(use_true_random=False)


def _mutated_client(rng: random.Random) -> bytes:
    return streams.mutate(streams.client_script(rng).data, rng)


def _mutated_server(rng: random.Random) -> bytes:
    return streams.mutate(streams.server_script(rng).data, rng)


def _byte_streams(side: str) -> st.SearchStrategy[bytes]:
    valid = streams.client_script if side == "client" else streams.server_script
    mutated = _mutated_client if side == "client" else _mutated_server
    return st.one_of(
        st.binary(max_size=2000),
        RANDOMS.map(lambda r: streams.soup(r, r.randint(0, 120))),
        RANDOMS.map(lambda r: valid(r).data),
        RANDOMS.map(mutated),
        RANDOMS.map(mutated),
    )


CLIENT_BYTES = _byte_streams("client")
SERVER_BYTES = _byte_streams("server")


# -- any bytes ----------------------------------------------------------------------------------


@FUZZ
@given(
    data=CLIENT_BYTES | SERVER_BYTES,
    version=st.sampled_from(VERSIONS),
    limits=LIMITS,
    chunks=CHUNKS,
)
def test_parser_reads_any_bytes_or_raises_a_remote_error(
    data: bytes, version: str, limits: Limits, chunks: list[int]
) -> None:
    """Events or RemoteProtocolError; bounded buffer; every frame re-serializes."""
    run_parser(data, version=version, limits=limits, chunks=chunks)


@FUZZ
@given(
    data=CLIENT_BYTES,
    prelude=st.sampled_from(PRELUDES),
    limits=LIMITS,
    chunks=CHUNKS,
)
def test_server_connection_reads_any_bytes(
    data: bytes, prelude: str, limits: Limits, chunks: list[int]
) -> None:
    """The sidecar's app leg: a SERVER Connection, fresh or connected in 1.0/1.1/1.2."""
    run_connection(data, role=Role.SERVER, prelude=prelude, limits=limits, chunks=chunks)


@FUZZ
@given(
    data=SERVER_BYTES,
    prelude=st.sampled_from(PRELUDES),
    limits=LIMITS,
    chunks=CHUNKS,
)
def test_client_connection_reads_any_bytes(
    data: bytes, prelude: str, limits: Limits, chunks: list[int]
) -> None:
    """The sidecar's broker leg: a CLIENT Connection, after CONNECT or connected."""
    run_connection(data, role=Role.CLIENT, prelude=prelude, limits=limits, chunks=chunks)


@FUZZ
@given(
    data=CLIENT_BYTES | SERVER_BYTES,
    role=st.sampled_from(list(Role)),
    prelude=st.sampled_from(PRELUDES),
    limits=LIMITS,
    chunks=CHUNKS,
)
def test_chunking_never_changes_what_a_connection_reads(
    data: bytes, role: Role, prelude: str, limits: Limits, chunks: list[int]
) -> None:
    """Whole, byte by byte and in random pieces: the same events and the same error, even
    where a CONNECTED in the middle of a buffer switches the version of what follows."""
    whole = run_connection(data, role=role, prelude=prelude, limits=limits, chunks=[len(data)])
    assert run_connection(data, role=role, prelude=prelude, limits=limits, chunks=chunks) == whole
    if len(data) <= 400:
        assert run_connection(data, role=role, prelude=prelude, limits=limits, chunks=[1]) == whole


@pytest.mark.parametrize(
    ("role", "data"),
    [
        (Role.SERVER, b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00"),  # a second CONNECT
        (Role.SERVER, b"SUBSCRIBE\ndestination:/q\n\n\x00"),  # no id in 1.2
        (Role.SERVER, b"MESSAGE\ndestination:/q\nmessage-id:1\nsubscription:0\n\n\x00"),
        (Role.CLIENT, b"CONNECTED\nversion:1.2\n\n\x00"),  # a second CONNECTED
        (Role.CLIENT, b"RECEIPT\n\n\x00"),  # no receipt-id
    ],
    ids=[
        "second CONNECT",
        "SUBSCRIBE without id",
        "MESSAGE to a server",
        "second CONNECTED",
        "bare RECEIPT",
    ],
)
def test_a_connection_broken_by_a_frame_rule_buffers_nothing_more(role: Role, data: bytes) -> None:
    """Regression (found by the properties above): a frame the parser accepts but the
    Connection refuses left the parser working, so everything the peer sent after its error
    was buffered without bound (6.5 MB for 100 chunks of 64 KiB). Now the buffer is dropped
    and later data discarded, as after a parser-level error."""
    conn = Connection(role)
    handshake(conn, "connected-1.2")
    conn.receive_data(data + b"trailing bytes")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    for _ in range(100):
        conn.receive_data(b"y" * 65536)
    assert len(conn._parser._buf) == 0
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


@pytest.mark.parametrize(
    ("digits", "expected"),
    [
        (b"9" * 4301, "frame too large"),
        (b"1" * 10000, "frame too large"),
        (b"0" * 5000 + b"3", None),  # leading zeros: still 3
    ],
    ids=["4301 nines", "10000 ones", "5000 leading zeros"],
)
@pytest.mark.parametrize(
    "role", [None, Role.SERVER, Role.CLIENT], ids=["parser", "server", "client"]
)
def test_a_content_length_with_thousands_of_digits(
    digits: bytes, expected: str | None, role: Role | None
) -> None:
    """Regression (found while fuzzing): ``int()`` refuses more than 4300 digits, so such a
    ``content-length`` raised ValueError out of the parser, an internal error in the sidecar.
    Now a value longer than the frame limit's digits is "frame too large"; leading zeros are
    read as the number they pad."""
    data = b"SEND\ndestination:/q\ncontent-length:" + digits + b"\n\nabc\x00"
    if role is Role.CLIENT:
        data = data.replace(b"SEND", b"MESSAGE").replace(
            b"/q\n", b"/q\nmessage-id:1\nsubscription:0\n"
        )
    outcome = (
        run_parser(data, version="1.2")
        if role is None
        else run_connection(data, role=role, prelude="connected-1.2")
    )
    if expected is None:
        assert isinstance(outcome[0], Frame)
        assert outcome[0].body == b"abc"
    else:
        assert outcome[-1] == [
            "error",
            f"frame too large (more than {SIDECAR_LIMITS.max_frame_bytes} bytes)",
        ]


# -- unbounded streams ----------------------------------------------------------------------------


def _endless(prefix: bytes, unit: bytes, total: int, chunk: int) -> Iterator[bytes]:
    """``prefix`` then ``unit`` repeated until ``total`` bytes, in ``chunk``-sized pieces."""
    yield from pieces(prefix, [chunk])
    block = unit * max(1, chunk // len(unit))
    sent = len(prefix)
    while sent < total:
        yield block
        sent += len(block)


@settings(FUZZ, max_examples=200)
@given(
    prefix=RANDOMS.map(lambda r: streams.soup(r, r.randint(0, 12)))
    | RANDOMS.map(lambda r: streams.client_script(r, max_frames=1).data),
    unit=st.binary(min_size=1, max_size=12) | RANDOMS.map(lambda r: streams.soup(r, 3) or b"\n"),
    chunk=st.sampled_from([1, 7, 100, 4096]),
    role=st.sampled_from([None, Role.SERVER]),
)
def test_any_endless_stream_errors_or_stays_bounded(
    prefix: bytes, unit: bytes, chunk: int, role: Role | None
) -> None:
    """``prefix + unit * ∞`` (cut at 64 KiB, 256x the frame limit): at every step the parser
    holds at most one frame's worth (plus compaction slack), or it has raised a remote error
    and holds nothing. Through a SERVER Connection too (heart-beats before CONNECT are legal,
    which is why the sidecar needs ``handshake_timeout``)."""
    limits = SMALL
    conn = Connection(Role.SERVER, limits) if role is not None else None
    parser = conn._parser if conn is not None else FrameParser(limits)
    target = conn if conn is not None else parser
    try:
        for piece in _endless(prefix, unit, 64 * 1024, chunk):
            target.receive_data(piece)
            while True:
                try:
                    event = target.next_event()
                except UnknownCommand:
                    continue  # a whole frame, consumed: reading goes on
                if event is NEED_DATA:
                    break
                if (
                    conn is not None
                    and isinstance(event, Frame)
                    and conn.connected_frame is None
                    and not serve_connect(conn, event)
                ):
                    return  # no common version: refused, as the sidecar does
            check_parser_buffer(parser, limits, len(piece))
    except RemoteProtocolError:
        assert len(parser._buf) == 0


#: More than the default frame limit (144 MiB since the limits cover the brokers' own), so that
#: an endless body must trip it.
_ENDLESS_BYTES = SIDECAR_LIMITS.max_frame_bytes + 4 * 65536

#: Streams that must end in the named limit's error before one frame limit + one chunk are in:
#: (name, prefix, endless unit, error). Fed up to _ENDLESS_BYTES; they trip before.
ERRORING = [
    ("header line never ends", b"SEND\ndestination:/q\nx:", b"v", "header line too long"),
    ("command line never ends", b"", b"S", "header line too long"),
    ("head never ends", b"SEND\n", b"h:v\n", "too many headers"),
    ("body without NUL", b"SEND\ndestination:/q\n\n", b"body", "frame too large"),
    ("CRs never end", b"\r", b"\r", "header line too long"),
    ("content-length, then no NUL", b"SEND\ncontent-length:3\n\nabc", b"x", "not terminated"),
    ("content-length too large", b"SEND\ncontent-length:99999999999\n\n", b"x", "too large"),
]


@pytest.mark.parametrize(
    ("name", "prefix", "unit", "error"), ERRORING, ids=[e[0] for e in ERRORING]
)
@pytest.mark.parametrize(
    "role", [None, Role.SERVER, Role.CLIENT], ids=["parser", "server", "client"]
)
def test_endless_streams_that_never_end_a_frame_trip_a_limit(
    name: str, prefix: bytes, unit: bytes, error: str, role: Role | None
) -> None:
    """The sidecar's default limits: the error comes within one frame limit of data and the
    buffer never holds more than the bound while it is coming."""
    limits = SIDECAR_LIMITS
    chunk = 65536
    fed = 0
    if role is None:
        parser = FrameParser(limits, version="1.2")
        target: FrameParser | Connection = parser
    else:
        conn = Connection(role, limits)
        handshake(conn, "connected-1.2")
        parser = conn._parser
        target = conn

    def feed_until_error() -> None:
        nonlocal fed
        for piece in _endless(prefix, unit, _ENDLESS_BYTES, chunk):
            target.receive_data(piece)
            fed += len(piece)
            while target.next_event() is not NEED_DATA:
                pass
            check_parser_buffer(parser, limits, len(piece))

    with pytest.raises(RemoteProtocolError, match=error):
        feed_until_error()
    assert fed <= limits.max_frame_bytes + 2 * chunk, fed
    assert len(parser._buf) == 0


#: Streams that are valid for ever: (name, endless unit, events per unit, megabytes by default).
ENDLESS_VALID = [
    ("heart-beat LFs", b"\n", 1, 2),
    ("heart-beat CRLFs", b"\r\n", 1, 2),
    ("tiny SEND frames", b"SEND\ndestination:/q\n\n\x00", 1, 3),
    ("tiny frames with heart-beats", b"SEND\ndestination:/q\n\nx\x00\r\n", 2, 3),
    (
        "binary bodies with content-length",
        b"SEND\ndestination:/q\ncontent-length:4\n\n\x00\x00\x00\x00\x00",
        1,
        3,
    ),
]


@pytest.mark.parametrize(
    ("name", "unit", "per_unit", "megabytes"), ENDLESS_VALID, ids=[e[0] for e in ENDLESS_VALID]
)
def test_endless_valid_streams_keep_the_buffer_bounded(
    name: str, unit: bytes, per_unit: int, megabytes: int
) -> None:
    """Heart-beats and tiny frames without end (a connected 1.2 server, the sidecar's app leg):
    every event comes out and the buffer stays within one chunk plus compaction slack.
    ``MQ_SIDECAR_FUZZ_MB`` raises the amount (the issue's 100 MB: ``MQ_SIDECAR_FUZZ_MB=100``)."""
    limits = SIDECAR_LIMITS
    total = int(os.environ.get("MQ_SIDECAR_FUZZ_MB", megabytes)) * 1024 * 1024
    conn = Connection(Role.SERVER, limits)
    handshake(conn, "connected-1.2")
    parser = conn._parser
    events = fed = biggest = 0
    for piece in _endless(b"", unit, total, 65536):
        conn.receive_data(piece)
        fed += len(piece)
        while conn.next_event() is not NEED_DATA:
            events += 1
        biggest = max(biggest, len(parser._buf))
        assert len(parser._buf) - parser._pos < len(unit), "a complete unit was left unread"
    assert biggest <= 2 * 65536 + len(unit)
    assert events == fed // len(unit) * per_unit


# -- atheris ------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_atheris_harness_runs_clean(tmp_path: Path) -> None:
    """A short coverage-guided run (10,000 inputs or 12 s, whichever first) of the atheris
    harness as a subprocess: exit status 0, no crash, and its summary line counts inputs."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fuzz.atheris_protocol",
            "-runs=10000",
            "-max_total_time=12",
            f"-artifact_prefix={tmp_path}/",
            "-seed=1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    summary = re.search(r"atheris: inputs tried (\d+), crashes (\d+), hangs (\d+)", output)
    assert summary is not None, output[-4000:]
    tried, crashes, hangs = (int(g) for g in summary.groups())
    assert crashes == 0, output[-4000:]
    assert hangs == 0, output[-4000:]
    assert tried > 100, output[-4000:]
