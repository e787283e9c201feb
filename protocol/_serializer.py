"""Frames to bytes: :func:`serialize`, and what a heart-beat looks like on the wire."""

from __future__ import annotations

from ._errors import LocalProtocolError
from ._frame import NEVER_ESCAPED, Frame
from ._headers import ESCAPERS, check_representable
from ._versions import check_version

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["HEARTBEAT_BYTES", "serialize"]

#: What one heart-beat looks like on the wire: a single EOL (STOMP 1.2 "Heart-beating").
HEARTBEAT_BYTES: bytes = b"\n"


def serialize(frame: Frame, version: str) -> bytes:
    """Encode ``frame`` for a connection speaking STOMP ``version`` (STOMP 1.2 "STOMP Frames").

    Layout: command, LF, one ``name:value`` LF per header (escaped per version, never escaped in
    CONNECT/STOMP/CONNECTED frames), LF, body, NUL. Lines end in LF only.

    ``content-length``: when the frame has one, the first entry's value is rewritten to
    ``len(body)`` in place and later entries are dropped. When it has none, one is appended only
    if the body contains a NUL byte (a body without it ends at the first NUL). It is not added
    otherwise, because brokers such as ActiveMQ read a ``content-length`` as "bytes message".

    Round trip: for every frame that ``serialize`` accepts, ``FrameParser(version=version)`` reads
    the bytes back as an equal frame (after the ``content-length`` normalisation above).

    Args:
        frame: the frame to encode.
        version: ``"1.0"``, ``"1.1"`` or ``"1.2"``.

    Returns:
        The frame's bytes, ending with NUL.

    Raises:
        LocalProtocolError: a header this version cannot carry: in 1.0 and in CONNECT-type
            frames a name with ``:``, LF or CR, or a value with LF or CR; in 1.1 a value ending in
            CR; in any version a name starting with NUL or text that is not encodable as UTF-8.
        ValueError: unknown ``version``.
    """
    if version == "1.2" and frame.command not in NEVER_ESCAPED:
        data = _serialize_12(frame)
        if data is not None:
            return data
    return _serialize_general(frame, version)


def _serialize_general(frame: Frame, version: str) -> bytes:
    """:func:`serialize` header by header, for every version and frame."""
    check_version(version)
    escaped = version != "1.0" and frame.command not in NEVER_ESCAPED
    escape = ESCAPERS[version] if escaped else None
    body = frame.body
    parts = [frame.command._value_, "\n"]  # _value_: .value is a slow property in 3.11
    length_seen = False
    for name, raw_value in frame.headers:
        value = raw_value
        if name == "content-length":
            if length_seen:
                continue
            length_seen = True
            value = str(len(body))
        if escape is None:
            check_representable(name, value, version, escaped)
            parts += (name, ":", value, "\n")
        else:
            if name[:1] == "\0" or value[-1:] == "\r":  # the only escaped-path failures
                check_representable(name, value, version, escaped)
            parts += (escape(name), ":", escape(value), "\n")
    if not length_seen and b"\0" in body:
        parts += ("content-length:", str(len(body)), "\n")
    parts.append("\n")
    try:
        head = "".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(
            f"a header of the {frame.command} frame is not encodable as UTF-8: {exc}"
        ) from None
    return b"".join((head, body, b"\0"))


def _serialize_12(frame: Frame) -> bytes | None:
    """:func:`serialize` of an escaped STOMP 1.2 frame with the whole head escaped at once.

    Names and values are joined with placeholder separators (NUL between headers, SOH
    between a name and its value), escaped with one ``str.replace`` per escape present, and
    the separators then become LF and ``:``: a few C-level calls instead of two per header.
    ``content-length`` is handled as there. Returns None, for the general path, when a name or
    value holds a NUL or SOH itself.
    """
    headers = frame.headers
    body = frame.body
    flat = "\0".join([name + "\1" + value for name, value in headers])
    length_seen = False
    if "content-length" in flat:
        # The first entry says len(body), later ones are dropped (as the general path does).
        # The usual case, one entry that says it already, leaves ``flat`` as it is. (A NUL or
        # SOH in a name or value that fools these searches fails the separator count below.)
        length_text = str(len(body))
        bounded = "\0" + flat + "\0"
        if bounded.count("\0content-length\1") == 1 and (
            "\0content-length\1" + length_text + "\0" in bounded
        ):
            length_seen = True
        else:
            out: list[tuple[str, str]] = []
            for item in headers:
                if item[0] != "content-length":
                    out.append(item)
                elif not length_seen:
                    length_seen = True
                    out.append(("content-length", length_text))
            if length_seen:
                headers = tuple(out)
                flat = "\0".join([name + "\1" + value for name, value in headers])
    if flat.count("\1") != len(headers) or flat.count("\0") != max(len(headers) - 1, 0):
        return None
    if "\\" in flat or "\n" in flat or ":" in flat or "\r" in flat:
        flat = flat.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
        flat = flat.replace("\r", "\\r")
    head = frame.command._value_ + "\n" + flat.replace("\1", ":").replace("\0", "\n")
    if headers:
        head += "\n"
    if not length_seen and b"\0" in body:
        head += "content-length:" + str(len(body)) + "\n"
    try:
        return b"".join((head.encode("utf-8"), b"\n", body, b"\0"))
    except UnicodeEncodeError:
        return None  # the general path raises the precise error
