"""The CONNECT frame the sidecar sends a broker, for sessions and readiness probes alike
(pure: no I/O).

STOMP 1.2 "CONNECT or STOMP Frame": the sidecar offers every version, sets ``host``,
``heart-beat`` and the credentials itself and passes the app's other CONNECT headers on.
"""

from __future__ import annotations

import protocol
from config import Broker, Config
from protocol import Command, Frame

__all__ = ["UPSTREAM_SEND_SHARE", "connect_frame", "upstream_heart_beat"]

#: The share of the heart-beat interval promised to a broker (the CONNECT's ``cx``) after which
#: an upstream leg writes a beat when it wrote nothing else. ActiveMQ 5.17 judges a STOMP client
#: silent after ``cx`` times its ``hbGracePeriodMultiplier``, 1.0 by default
#: (ProtocolConverter): a beat written at ``cx`` has no margin. Measured: 933 of about 2,500
#: idle legs closed "Channel was inactive for too (>5000) long" in a 5,000-session run on a busy
#: 2-core machine (bench/admission.py; docs/brokers.md, "Heart-beats"). So the sidecar
#: promises twice the ``cx`` of ``upstream_heartbeat`` and writes at that ``cx``
#: (:func:`upstream_heart_beat`): a beat may run ``cx`` late, and there are no more beats.
UPSTREAM_SEND_SHARE = 0.5


#: Headers of an app's CONNECT that the sidecar sets itself on the upstream CONNECT.
_CONNECT_OWN_HEADERS = ("accept-version", "host", "heart-beat", "login", "passcode")


def upstream_heart_beat(config: Config) -> str:
    """The ``heart-beat`` header of an upstream leg's CONNECT for ``upstream_heartbeat =
    [cx, cy]``: ``"2cx,cy/2"``. The sidecar writes to an idle leg every ``cx`` ms and promises
    the broker twice that (:data:`UPSTREAM_SEND_SHARE`); it asks for beats at half the interval
    it judges silence by (a broker beats only after a check period without a write, so its gaps
    reach twice what was asked: :meth:`proxy.legs.stream.FrameStream.start_heartbeats`).
    ``cx`` or ``cy`` 0 stays 0 (no beats that way)."""
    cx, cy = config.upstream_heartbeat
    return f"{round(cx / UPSTREAM_SEND_SHARE)},{(cy + 1) // 2}"


def connect_frame(
    broker: Broker, config: Config, *, heart_beat: str, app_connect: Frame | None = None
) -> Frame:
    """The CONNECT for ``broker``, the same for sessions and readiness probes.

    Offers every STOMP version (the sidecar speaks the broker's best). ``host`` (STOMP 1.2
    "CONNECT"; RabbitMQ reads it as the vhost and refuses one that does not exist) is the
    app's, as it would reach the broker directly, unless it names the sidecar itself (the
    loopback address or name an app connects to: then it means "this server", and the broker's
    equivalent is used); that equivalent is the broker's configured virtual host, else its
    host name. Credentials are the broker's own, else the sidecar's (``login``/``passcode``),
    else, for a session (``app_connect`` given), the app's. The app's other CONNECT headers
    (``client-id`` for ActiveMQ durable subscriptions...) pass through.
    """
    host = broker.virtual_host if broker.virtual_host is not None else broker.host
    app_host = app_connect.get("host") if app_connect is not None else None
    if app_host is not None and not _names_the_sidecar(app_host, config):
        host = app_host
    headers: list[tuple[str, str]] = [
        ("accept-version", ",".join(protocol.VERSIONS)),
        ("host", host),
        ("heart-beat", heart_beat),
    ]
    login: str | None
    passcode: str | None
    if broker.login is not None:
        login, passcode = broker.login, broker.passcode.reveal() if broker.passcode else None
    elif config.login is not None:
        login, passcode = config.login, config.passcode.reveal() if config.passcode else None
    elif app_connect is not None:
        login, passcode = app_connect.get("login"), app_connect.get("passcode")
    else:
        login, passcode = None, None
    if login is not None:
        headers.append(("login", login))
        if passcode is not None:
            headers.append(("passcode", passcode))
    if app_connect is not None:
        headers.extend(
            (k, v)
            for k, v in app_connect.headers
            if k not in _CONNECT_OWN_HEADERS and _connect_representable(k, v)
        )
    return Frame(Command.CONNECT, tuple(headers))


def _names_the_sidecar(host: str, config: Config) -> bool:
    """Whether a CONNECT ``host`` header names the server the app connected to, the sidecar
    (stomp.py and others send the address they connected to, ``127.0.0.1`` or ``localhost``
    for a sidecar), rather than a virtual host."""
    name = host.strip().lower()
    if name.startswith("[") and "]" in name:  # [::1]:61613
        name = name[1 : name.index("]")]
    elif name.count(":") == 1:  # localhost:61613
        name = name.partition(":")[0]
    return (
        name in ("", "localhost", "::1", "0.0.0.0", "::", config.listen[0].lower())
        or name.startswith("127.")
        or name.endswith(".localhost")
    )


def _connect_representable(name: str, value: str) -> bool:
    """Whether a header can go in a CONNECT frame, which is never escaped (STOMP 1.2 "Value
    Encoding"): an app's CONNECT may carry a lone CR inside a value, the broker's cannot."""
    return not any(c in name for c in ":\r\n") and "\r" not in value and "\n" not in value
