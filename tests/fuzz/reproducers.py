"""Small reproducers of the sidecar bugs the fuzzers found, one function each.

Run (from the repository root; starts its own ActiveMQ and sidecar)::

    .venv/bin/python -m tests.fuzz.reproducers            # every reproducer, 5 tries each
    .venv/bin/python -m tests.fuzz.reproducers --tries 20 admin_head_then_bad_request

Each reproducer plays a few raw bytes (and, for races, traffic around them) against a real
``python -m proxy run`` and reports ``BUG`` when the sidecar logged a traceback or an ERROR
line (``internal error``) or answered wrongly, else ``ok``. Some are races, hence the tries.
Exit status 1 when any try showed a bug. Not collected by pytest: the fuzz tests
(``test_sidecar_fuzz.py``, ``test_admin_fuzz.py``) fail on the same bugs; these name them.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from testbed import ActiveMQ
from testbed.sidecar import SidecarProcess
from tests.fuzz.driver import fuzz_sidecar

__all__ = ["REPRODUCERS", "main"]

_CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00"


def _exchange(address: tuple[str, int], data: bytes, *, fin: bool = True) -> bytes:
    """Send ``data`` (then half-close), read until the peer closes (10 s at most)."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        if fin:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except OSError:
            pass
        return out


def lookahead_error_then_receipt(sc: SidecarProcess) -> str | None:
    """A SEND whose RECEIPT comes back after the next, broken frame was already parsed.

    ``_relay_app`` looks ahead (``next_buffered``) to see if a frame ends a burst; garbage
    there puts the app's ``protocol.Connection`` in ERROR before the frame is handled. A
    RECEIPT of an earlier frame then cannot be written (``cannot send RECEIPT: the connection
    is in state ERROR``) and ``_to_app`` retries itself without end (RecursionError). The
    second SEND waits for window room (two 600 kB bodies, 1 MiB window), which opens the
    window for the first one's RECEIPT.
    """
    body = b"x" * 600_000
    data = (
        _CONNECT
        + b"SEND\ndestination:/topic/mq-sidecar-fuzz.repro\nreceipt:r1\n\n"
        + body
        + b"\x00SEND\ndestination:/topic/mq-sidecar-fuzz.repro\nreceipt:r2\n\n"
        + body
        + b"\x00BOGUS\n\n\x00"
    )
    out = _exchange(sc.address, data, fin=False)
    # The ERROR is the broker's own answer to BOGUS (ActiveMQ: "Unknown STOMP action: BOGUS").
    named = b"ERROR\n" in out and b"BOGUS" in out
    return None if named else f"no ERROR naming BOGUS: {out[-200:]!r}"


def connect_header_with_inner_cr(sc: SidecarProcess) -> str | None:
    """An app CONNECT header value with a CR inside (legal: CONNECT frames are not escaped,
    only a trailing CR is stripped). The sidecar copies it into its upstream CONNECT, which
    ``serialize`` refuses (LocalProtocolError), and nothing catches that in
    ``proxy/legs/broker.py`` ``connect_upstream``: internal error instead of an ERROR naming the
    header (or dropping it)."""
    out = _exchange(sc.address, b"CONNECT\naccept-version:1.2\nhost:/\nclient-id:a\rb\n\n\x00")
    return None if b"internal error" not in out else f"answered {out[:120]!r}"


def trailing_cr_to_a_1_1_subscriber(sc: SidecarProcess) -> str | None:
    """A STOMP 1.2 app sends a header value ending in CR (escaped ``\\r``); a STOMP 1.1 app
    subscribed to the destination gets it as a MESSAGE, which 1.1 cannot carry (it would read
    as a CRLF line end). ``_to_app`` catches the LocalProtocolError, but ``_representable``
    only cleans frames for 1.0, so ``_to_app`` calls itself with the same frame until
    RecursionError: internal error in the subscriber's session."""
    topic = b"/topic/mq-sidecar-fuzz.repro-cr"
    with socket.create_connection(sc.address, timeout=10) as sub:
        sub.sendall(
            b"CONNECT\naccept-version:1.1\nhost:/\n\n\x00SUBSCRIBE\nid:0\ndestination:"
            + topic
            + b"\nreceipt:s\n\n\x00"
        )
        seen = b""
        while b"receipt-id:s" not in seen:
            seen += sub.recv(65536)
        _exchange(
            sc.address,
            _CONNECT + b"SEND\ndestination:" + topic + b"\nx-h:value\\r\nreceipt:r\n\nhi\x00",
        )
        sub.settimeout(5)
        try:
            while b"MESSAGE" not in seen and (chunk := sub.recv(65536)):
                seen += chunk
        except OSError:
            pass
    return None if b"MESSAGE" in seen else f"the 1.1 subscriber got {seen[-160:]!r}"


def ack_after_disconnect(sc: SidecarProcess) -> str | None:
    """An ``ack:auto`` subscription with messages in flight, then DISCONNECT: the sidecar's
    own ACK of a message that arrives after it sent DISCONNECT upstream is refused by the
    upstream Connection (``cannot send ACK after DISCONNECT``) in ``_send_hidden_acks``,
    which only catches TransportLost: internal error."""
    topic = b"/topic/mq-sidecar-fuzz.repro-ack"
    with socket.create_connection(sc.address, timeout=10) as app:
        app.sendall(
            _CONNECT + b"SUBSCRIBE\nid:0\ndestination:" + topic + b"\nack:auto\nreceipt:s\n\n\x00"
        )
        seen = b""
        while b"receipt-id:s" not in seen:
            seen += app.recv(65536)
        with socket.create_connection(sc.address, timeout=10) as producer:
            producer.sendall(
                _CONNECT
                + b"".join(b"SEND\ndestination:" + topic + b"\n\n%d\x00" % i for i in range(3000))
            )
            time.sleep(0.05)
            app.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")
            try:
                while app.recv(65536):
                    pass
            except OSError:
                pass
    return None


def admin_head_then_bad_request(sc: SidecarProcess) -> str | None:
    """A HEAD request, then a malformed one on the same keep-alive connection: the 400 is
    written as for a HEAD (``_HTTPConnection.head`` still True from the previous request),
    so h11 refuses its EndOfMessage (``Too little data for declared Content-Length``):
    internal error logged, and the client gets a 400 head whose body never comes."""
    out = _exchange(sc.admin_address, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\ngarbage\r\n\r\n")
    codes = re.findall(rb"HTTP/1\.1 (\d{3})", out)
    return None if codes == [b"200", b"400"] else f"statuses {codes}"


def admin_head_with_oversized_headers(sc: SidecarProcess) -> str | None:
    """A HEAD request whose head arrives whole but over ``max_header_bytes`` (8 KiB): it is
    answered 431 before the request is marked as a HEAD, so the 431's body was written and
    h11, which knows a HEAD response has none, refused it (``Too much data for declared
    Content-Length``): internal error logged, no answer. Found by the admin fuzz, seed 1."""
    big = b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    out = _exchange(sc.admin_address, big)
    codes = re.findall(rb"HTTP/1\.1 (\d{3})", out)
    if codes != [b"431"]:
        return f"statuses {codes}"
    return None if out.endswith(b"\r\n\r\n") else "a body after the 431 to a HEAD"


REPRODUCERS: dict[str, Callable[[SidecarProcess], str | None]] = {
    f.__name__: f
    for f in (
        lookahead_error_then_receipt,
        connect_header_with_inner_cr,
        trailing_cr_to_a_1_1_subscriber,
        ack_after_disconnect,
        admin_head_then_bad_request,
        admin_head_with_oversized_headers,
    )
}


def main(argv: list[str] | None = None) -> int:
    """Run the named reproducers (default: all) ``--tries`` times; print BUG/ok lines."""
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.reproducers")
    parser.add_argument("names", nargs="*", choices=[*REPRODUCERS, []], default=[])
    parser.add_argument("--tries", type=int, default=5)
    args = parser.parse_args(argv)
    names = args.names or list(REPRODUCERS)
    bugs = 0
    with tempfile.TemporaryDirectory(prefix="mq-sidecar-repro-") as tmp:
        work = Path(tmp)
        with (
            ActiveMQ("reproamq", work) as broker,
            fuzz_sidecar("sidecar", work, brokers=broker.stomp_url) as sc,
        ):
            for name in names:
                for attempt in range(1, args.tries + 1):
                    before = len(sc.log_text())
                    wrong = REPRODUCERS[name](sc)
                    time.sleep(1.0)  # let the session end and log
                    text = sc.log_text()[before:]
                    logged = re.findall(r"^\S+ \S+ (?:ERROR|CRITICAL) .*$", text, re.MULTILINE)
                    errors = sorted(set(re.findall(r"(\w+(?:Error|Exception): .{0,70})", text)))
                    verdict = "BUG" if logged or wrong else "ok"
                    bugs += verdict == "BUG"
                    detail = "; ".join([*((wrong and [wrong]) or []), *logged[:1], *errors[:2]])
                    print(f"{name} try {attempt}: {verdict}" + (f": {detail}" if detail else ""))
                    sys.stdout.flush()
    return int(bugs > 0)


if __name__ == "__main__":
    sys.exit(main())
