"""Header value encoding per STOMP version (STOMP 1.2 "Value Encoding").

==========  =========================================================================
version     escapes in header names and values
==========  =========================================================================
1.0         none: names can't hold ``:``, LF or CR, values can't hold LF or CR
1.1         ``\\n`` (LF), ``\\c`` (``:``), ``\\\\`` (backslash)
1.2         as 1.1, plus ``\\r`` (CR)
==========  =========================================================================

In 1.1 and 1.2 any other escape sequence is a fatal protocol error ("Undefined escape
sequences such as \\t MUST be treated as a fatal protocol error"). CONNECT, STOMP and CONNECTED
frames are never escaped in any version, because the version is not negotiated yet when they
travel; they follow the 1.0 rules.

This parser strips ONE trailing CR from every command and header line in every version, since
STOMP 1.2 allows CRLF line ends and 1.0/1.1 peers in the wild send them too. The price: a value
that really ends in CR can't be carried where CR is not escaped (1.0, 1.1, CONNECT frames), so
:func:`check_representable` refuses it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ._errors import LocalProtocolError, RemoteProtocolError, remote_error
from ._versions import check_version

# Everything in `__all__` gets re-exported as part of the public API of `protocol`.
__all__ = ["escape_header", "unescape_header"]


def _escape_11(text: str) -> str:
    # Most names and values need no escaping, and ``in`` tests are cheaper than calls; where
    # needed, str.replace chains beat str.translate with a dict by 3-5x on short strings.
    if "\\" in text or "\n" in text or ":" in text:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    return text


def _escape_12(text: str) -> str:
    if "\\" in text or "\n" in text or ":" in text or "\r" in text:
        text = text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
        return text.replace("\r", "\\r")
    return text


#: The escaping function of each version that escapes (backslash first, so no double escaping).
ESCAPERS = {"1.1": _escape_11, "1.2": _escape_12}
_UNESCAPE = {
    "1.1": {"n": "\n", "c": ":", "\\": "\\"},
    "1.2": {"n": "\n", "c": ":", "\\": "\\", "r": "\r"},
}
_ESCAPE_SEQUENCE = re.compile(r"\\(.?)", re.DOTALL)


def escape_header(text: str, version: str) -> str:
    """Escape a header name or value for the wire (STOMP 1.2 "Value Encoding").

    Args:
        text: the logical (unescaped) name or value.
        version: ``"1.0"`` (returned unchanged), ``"1.1"`` or ``"1.2"``.

    Returns:
        The escaped text. It does not check that 1.0 text is representable; :func:`serialize`
        does that.

    Raises:
        ValueError: unknown ``version``.
    """
    check_version(version)
    if version == "1.0":
        return text
    return ESCAPERS[version](text)


def unescape_header(raw: str, version: str) -> str:
    """Undo :func:`escape_header`: turn a name or value read from the wire into its logical form.

    Args:
        raw: the text between the line start and ``:``, or between ``:`` and the line end.
        version: ``"1.0"`` (returned unchanged), ``"1.1"`` or ``"1.2"``.

    Raises:
        RemoteProtocolError: an undefined escape sequence (``\\t``, a lone trailing backslash,
            ``\\r`` in 1.1) in 1.1/1.2 (STOMP 1.2 "Value Encoding": a fatal protocol error).
        ValueError: unknown ``version``.
    """
    check_version(version)
    if version == "1.0" or "\\" not in raw:
        return raw
    # Split out the escaped backslashes; every backslash left must then start \n, \c (or \r).
    pieces = raw.split("\\\\")
    for i, piece in enumerate(pieces):
        if "\\" in piece:
            text = piece.replace("\\n", "\n").replace("\\c", ":")
            if version == "1.2":
                text = text.replace("\\r", "\r")
            if "\\" in text:
                raise _undefined_escape(raw, version)
            pieces[i] = text
    return "\\".join(pieces)


def _undefined_escape(raw: str, version: str) -> RemoteProtocolError:
    table = _UNESCAPE[version]
    sequence = next(
        ("\\" + m.group(1) for m in _ESCAPE_SEQUENCE.finditer(raw) if m.group(1) not in table),
        "\\",
    )
    return remote_error(
        f"undefined escape sequence {sequence!r} in a header (STOMP {version})",
        f"STOMP {version} header escapes are: "
        + ", ".join(repr("\\" + c) for c in table)
        + f". The header read {raw[:200]!r}.",
    )


def check_representable(name: str, value: str, version: str, escaped: bool) -> None:
    """Raise LocalProtocolError unless header ``name:value`` survives a trip over the wire.

    ``escaped`` is False for 1.0 and for CONNECT/STOMP/CONNECTED frames (no escaping at all).
    """
    if name.startswith("\0"):
        # A NUL where a header line starts ends the frame's head early for this parser.
        raise LocalProtocolError(f"header name {name!r} cannot start with a NUL byte")
    if not escaped:
        if ":" in name or "\n" in name or "\r" in name:
            raise LocalProtocolError(
                f"header name {name!r} contains ':', LF or CR, which STOMP {version} "
                "(or a CONNECT/CONNECTED frame) cannot carry"
            )
        if "\n" in value or "\r" in value:
            raise LocalProtocolError(
                f"value of header {name!r} contains LF or CR, which STOMP {version} "
                "(or a CONNECT/CONNECTED frame) cannot carry"
            )
    elif version == "1.1" and value.endswith("\r"):
        raise LocalProtocolError(
            f"value of header {name!r} ends with CR, which STOMP 1.1 cannot escape "
            "(it would read as a CRLF line end)"
        )


def _unescape_fast(raw: str, version: str) -> str:
    """:func:`unescape_header` for the common case (no escaped backslash) in a few
    ``str.replace`` calls; anything else, or an undefined escape, goes to it."""
    if "\\\\" not in raw:
        text = raw.replace("\\c", ":").replace("\\n", "\n")
        if version == "1.2":
            text = text.replace("\\r", "\r")
        if "\\" not in text:
            return text
    return unescape_header(raw, version)


def unescaped_headers(
    headers: Iterable[tuple[str, str]], version: str
) -> tuple[tuple[str, str], ...]:
    """Headers read in an escaping ``version`` (1.1, 1.2) in their logical form.

    Raises:
        RemoteProtocolError: an undefined escape sequence (STOMP 1.2 "Value Encoding").
    """
    return tuple(
        [
            (
                _unescape_fast(name, version) if "\\" in name else name,
                _unescape_fast(value, version) if "\\" in value else value,
            )
            for name, value in headers
        ]
    )
