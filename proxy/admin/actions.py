"""The admin plane's actions: what an operator may ask the sidecar to do (docs/operations.md,
"Actions").

==========================  ========================================================================
``POST /actions/evacuate``  ``{"broker": "host:port", "for_seconds": <optional number>}``: every
                            session on the broker moves to another one at its next quiet point
                            (FAILOVER, reason ``evacuated``), and the broker stays out of the
                            rotation until readmitted or for ``for_seconds``
                            (:meth:`proxy.rotation.BrokerRotation.evacuate`).
``POST /actions/readmit``   ``{"broker": "host:port"}``: back into the rotation
                            (``/actions/restore``, its first name, still works: deprecated).
``POST /actions/drain``     ``{}`` or no body: the drain SIGTERM begins; the sidecar stops after it.
==========================  ========================================================================

The rules (Envoy's admin interface: mutations never on a GET):

* ``POST`` only: a GET or a HEAD gets 405 with ``Allow: POST``, and nothing is done.
* The bearer token always: without an ``admin_token_file`` every action is refused with 403,
  whatever the address it came from (loopback too: a pod's other containers share it); no or
  a wrong token gets 401 and nothing else (the body is not read); an unreadable token file 503.
* The body is JSON, at most :data:`MAX_BODY_BYTES`, with exactly the fields the action takes:
  anything else is 400, as is a broker that is not in the list.
* An action the sidecar cannot do gets 409 with the reason: an evacuation that would leave the
  sessions nowhere to go, the readmission of a broker that is not evacuated, a second drain.

Every answer is JSON ``{"ok": bool, "message": str}`` (the live page shows ``message``). Every
action asked is logged with the address of who asked and counted
(``mq_sidecar_admin_actions_total{action,result}``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable

import h11
import trio

from proxy.admin.http import (
    AUTHENTICATE,
    BearerToken,
    HTTPConnection,
    TokenCheck,
    header_value,
    peer_address,
)
from proxy.reconnect.evacuations import (
    MAX_EVACUATION_SECONDS,
    Evacuation,
    EvacuationRefused,
    UnknownBroker,
)
from proxy.telemetry.statistics import SidecarView
from proxy.telemetry.vocabulary import ActionResult, AdminAction

__all__ = ["MAX_BODY_BYTES", "AdminActions", "evacuation_status"]

log = logging.getLogger("mq_sidecar.admin")

#: Bytes an action's body may have: a broker label and a number take a hundred.
MAX_BODY_BYTES = 4096
_JSON = b"application/json"
#: What each result answers with.
_STATUS = {
    ActionResult.DONE: 200,
    ActionResult.BAD_REQUEST: 400,
    ActionResult.UNAUTHORIZED: 401,
    ActionResult.FORBIDDEN: 403,
    ActionResult.REFUSED: 409,
    ActionResult.UNAVAILABLE: 503,
}
#: The fields each action's body takes (required, optional).
_FIELDS: dict[AdminAction, tuple[frozenset[str], frozenset[str]]] = {
    AdminAction.EVACUATE: (frozenset({"broker"}), frozenset({"for_seconds"})),
    AdminAction.READMIT: (frozenset({"broker"}), frozenset()),
    AdminAction.RESTORE: (frozenset({"broker"}), frozenset()),
    AdminAction.DRAIN: (frozenset(), frozenset()),
}

Handler = Callable[[HTTPConnection, h11.Request], Awaitable[int]]
_Answer = tuple[ActionResult, str, dict[str, object]]


class _BadRequest(Exception):
    """The body is not what the action takes; the message says what is wrong."""


def evacuation_status(entry: Evacuation, now: float, wall: float) -> dict[str, object]:
    """An evacuation as ``/status`` and the action's answer show it: its reason, seconds since
    it began, seconds left and its end as Unix time (None: until readmitted). ``now`` is trio
    seconds (the entry's clock), ``wall`` Unix seconds at the same moment."""
    left = None if entry.until is None else max(0.0, entry.until - now)
    return {
        "reason": entry.reason,
        "since_seconds": round(now - entry.since, 3),
        "seconds_left": None if left is None else round(left, 3),
        "until_unix": None if left is None else round(wall + left, 3),
    }


class AdminActions:
    """The handlers of ``POST /actions/...`` for one admin plane (see the module docstring).

    Args:
        sidecar: the daemon acted on (its rotation's
            :meth:`~proxy.rotation.BrokerRotation.evacuate` and
            :meth:`~proxy.rotation.BrokerRotation.readmit`,
            :meth:`~proxy.app.Sidecar.request_shutdown`).
        token: the admin plane's bearer token; None (no ``admin_token_file``): every action
            is refused.
    """

    def __init__(self, sidecar: SidecarView, token: BearerToken | None) -> None:
        self.sidecar = sidecar
        self.token = token

    def handler(self, action: AdminAction) -> Handler:
        """The route handler of ``action`` (it checks method and token itself)."""

        async def handle(http: HTTPConnection, request: h11.Request) -> int:
            return await self.serve(http, request, action)

        return handle

    async def serve(self, http: HTTPConnection, request: h11.Request, action: AdminAction) -> int:
        """Answer one request to ``action``; returns the status sent."""
        if request.method != b"POST":
            method = request.method.decode("latin-1")
            body = {"ok": False, "message": f"method {method} not allowed; use POST"}
            await http.respond(
                405, _dumps(body), content_type=_JSON, headers=((b"allow", b"POST"),)
            )
            return 405
        peer = peer_address(http.stream)
        result, message, extra = await self._authorized(http, request, action, peer)
        status = _STATUS[result]
        self.sidecar.metrics.admin_action(action, result)
        level = logging.WARNING if result in _LOUD else logging.INFO
        log.log(level, "admin action %s asked by %s: %s: %s", action, peer, result, message)
        headers: tuple[tuple[bytes, bytes], ...] = ()
        if result is ActionResult.UNAUTHORIZED:
            self.sidecar.metrics.admin_unauthorized()
            headers = ((b"www-authenticate", AUTHENTICATE),)
        elif result is ActionResult.UNAVAILABLE:
            headers = ((b"retry-after", b"5"),)
        answer = {"ok": result is ActionResult.DONE, "message": message, **extra}
        await http.respond(status, _dumps(answer), content_type=_JSON, headers=headers)
        return status

    async def _authorized(
        self, http: HTTPConnection, request: h11.Request, action: AdminAction, peer: str
    ) -> _Answer:
        """The token's verdict, else the body's, else the action's."""
        if self.token is None:
            return (
                ActionResult.FORBIDDEN,
                "actions need the admin token, and no admin_token_file is set "
                "(docs/operations.md, Actions)",
                {},
            )
        check = self.token.check(request)
        if check is TokenCheck.UNAVAILABLE:
            return (
                ActionResult.UNAVAILABLE,
                "the admin token cannot be read (admin_token_file); see the sidecar's log",
                {},
            )
        if check is not TokenCheck.OK:
            return ActionResult.UNAUTHORIZED, "this action needs Authorization: Bearer", {}
        try:
            fields = _fields(action, await _read_body(http, request))
        except _BadRequest as exc:
            return ActionResult.BAD_REQUEST, str(exc), {}
        if action is AdminAction.DRAIN:
            return self._drain()
        broker = fields["broker"]
        if not isinstance(broker, str) or not broker:
            return ActionResult.BAD_REQUEST, '"broker" must be a broker label "host:port"', {}
        try:
            if action is AdminAction.EVACUATE:
                return self._evacuate(broker, fields.get("for_seconds"), peer)
            return self._readmit(broker)
        except UnknownBroker as exc:
            return ActionResult.BAD_REQUEST, str(exc), {}

    def _evacuate(self, broker: str, for_seconds: object, peer: str) -> _Answer:
        if for_seconds is not None and (
            isinstance(for_seconds, bool)
            or not isinstance(for_seconds, int | float)
            or not math.isfinite(for_seconds)
            or not 0 < for_seconds <= MAX_EVACUATION_SECONDS
        ):
            return (
                ActionResult.BAD_REQUEST,
                f'"for_seconds" must be a number of seconds above 0 and at most '
                f"{MAX_EVACUATION_SECONDS:g} (leave it out: until readmitted)",
                {},
            )
        seconds = None if for_seconds is None else float(for_seconds)
        host = peer.rpartition(":")[0] or peer
        try:
            entry = self.sidecar.rotation.evacuate(
                broker, f"requested on the admin plane by {host}", for_seconds=seconds
            )
        except EvacuationRefused as exc:
            return ActionResult.REFUSED, f"{broker} not evacuated: {exc}", {}
        on_it = sum(1 for s in self.sidecar.statistics().sessions if s.broker == broker)
        until = "until readmitted" if seconds is None else f"for {seconds:g} s"
        message = (
            f"{broker} evacuated {until}: {on_it} session(s) on it move to another broker at "
            "their next quiet point"
        )
        status = evacuation_status(entry, trio.current_time(), time.time())
        return ActionResult.DONE, message, {"evacuation": status}

    def _readmit(self, broker: str) -> _Answer:
        entry = self.sidecar.rotation.readmit(broker)
        if entry is None:
            return ActionResult.REFUSED, f"{broker} is not evacuated", {}
        return ActionResult.DONE, f"{broker} is back in the rotation", {}

    def _drain(self) -> _Answer:
        sidecar = self.sidecar
        if sidecar.shutdown_requested.is_set():
            return ActionResult.REFUSED, "a drain is already under way", {}
        sessions = len(sidecar.statistics().sessions)
        sidecar.request_shutdown()
        timeout = sidecar.config.durations.drain_timeout
        return (
            ActionResult.DONE,
            f"draining {sessions} session(s) within drain_timeout ({timeout:g} s); the sidecar "
            "stops when they are done",
            {},
        )


#: Results logged as warnings: the sidecar changed, or someone without the token tried.
_LOUD = frozenset({ActionResult.DONE, ActionResult.UNAUTHORIZED, ActionResult.FORBIDDEN})


async def _read_body(http: HTTPConnection, request: h11.Request) -> bytes:
    """The request's body, at most :data:`MAX_BODY_BYTES` (the admin plane's request deadline
    bounds the time). Once it is read whole the connection may be kept alive.

    Raises:
        _BadRequest: the body is larger.
        trio.BrokenResourceError: the client left before the end of the body.
    """
    if http.conn.their_state is h11.DONE:  # no body: its end was read with the head
        return b""
    length = header_value(request, b"content-length").strip()
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise _BadRequest(f"body of {length} bytes; an action takes at most {MAX_BODY_BYTES}")
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await http.next_event()
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_BODY_BYTES:
                raise _BadRequest(f"body over {MAX_BODY_BYTES} bytes")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            http.must_close = False
            return b"".join(chunks)
        else:
            raise trio.BrokenResourceError("the client left during the request body")


def _fields(action: AdminAction, body: bytes) -> dict[str, object]:
    """The body as the action's fields (an empty body is ``{}``).

    Raises:
        _BadRequest: not a JSON object, a field missing or one the action does not take.
    """
    if not body.strip():
        value: object = {}
    else:
        try:
            value = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _BadRequest("the body must be a JSON object")
    required, optional = _FIELDS[action]
    missing = sorted(required - value.keys())
    unknown = sorted(value.keys() - required - optional)
    if missing or unknown:
        takes = ", ".join(f'"{f}"' for f in sorted(required | optional)) or "no field"
        said = [f"missing {', '.join(missing)}"] if missing else []
        said += [f"unknown {', '.join(unknown)}"] if unknown else []
        raise _BadRequest(f"{'; '.join(said)}: {action} takes {takes}")
    return value


def _dumps(value: dict[str, object]) -> bytes:
    return json.dumps(value, sort_keys=True).encode() + b"\n"
