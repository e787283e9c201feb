"""An app SEND as it goes upstream: the app's receipt taken off (the sidecar asks its own) and
the duplicate-detection id set (docs/behaviour.md, "Duplicate detection"), on a parsed
:class:`protocol.Frame` or, in the fast lane, on the bytes (:class:`protocol.RawFrame`,
docs/architecture.md, "The fast lane")."""

from __future__ import annotations

from protocol import Command, Frame, RawFrame
from proxy.session.core import SessionCore
from proxy.tracking import ARTEMIS_DUPLICATE_ID, DUPLICATE_ID_HEADER

__all__ = ["UpstreamSends"]


class UpstreamSends:
    """The rewriting of one session's SENDs; numbers the ids it makes (``<session>-<n>``)."""

    def __init__(self, core: SessionCore) -> None:
        self.core = core
        self._seq = 0

    def parsed(self, frame: Frame) -> tuple[Frame, str | None]:
        """:meth:`upstream` of a parsed SEND, which stays a Frame."""
        up, app_receipt = self.upstream(frame)
        assert isinstance(up, Frame)
        return up, app_receipt

    def upstream(self, frame: Frame | RawFrame) -> tuple[Frame | RawFrame, str | None]:
        """An app SEND as it goes upstream, and the app's receipt id, in one pass over the
        headers (the hot path): every ``receipt`` entry removed (the sidecar requests its
        own), and the duplicate-detection id added: ``mq-sidecar-id``, kept when the app set
        one, and the same value as Artemis' ``_AMQ_DUPL_ID`` unless present or the leg is a
        broker that ignores it (:attr:`proxy.legs.dialect.BrokerDialect.artemis_duplicate_ids`). A
        frame replayed on a new leg keeps the headers it was made with. A
        :class:`protocol.RawFrame` is spliced (:meth:`_raw`)."""
        if isinstance(frame, RawFrame):
            return self._raw(frame)
        app_receipt: str | None = None
        dup_id: str | None = None
        artemis = False
        headers: list[tuple[str, str]] = []
        for item in frame.headers:
            name = item[0]
            if name == "receipt":
                if app_receipt is None:
                    app_receipt = item[1]
                continue
            if name == DUPLICATE_ID_HEADER:
                if dup_id is None:
                    dup_id = item[1]
            elif name == ARTEMIS_DUPLICATE_ID:
                artemis = True
            headers.append(item)
        if dup_id is None:
            self._seq += 1
            dup_id = f"{self.core.id}-{self._seq}"
            headers.append((DUPLICATE_ID_HEADER, dup_id))
        if not artemis and self.core.leg.dialect.artemis_duplicate_ids:
            headers.append((ARTEMIS_DUPLICATE_ID, dup_id))
        return Frame.unchecked(Command.SEND, tuple(headers), frame.body), app_receipt

    def _raw(self, frame: RawFrame) -> tuple[Frame | RawFrame, str | None]:
        """:meth:`upstream` on the bytes: the same headers in the same places (the
        receipt lines cut out, the ids appended), so the same bytes leave, in one splice; a
        Frame when an id needs escaping (:meth:`protocol.RawFrame.spliced`)."""
        app_receipt = frame.get("receipt")
        dup_id = frame.get(DUPLICATE_ID_HEADER)
        add: list[tuple[str, str]] = []
        if dup_id is None:
            self._seq += 1
            dup_id = f"{self.core.id}-{self._seq}"
            add.append((DUPLICATE_ID_HEADER, dup_id))
        if self.core.leg.dialect.artemis_duplicate_ids and not frame.has(ARTEMIS_DUPLICATE_ID):
            add.append((ARTEMIS_DUPLICATE_ID, dup_id))
        cut = None if app_receipt is None else "receipt"
        up = frame.spliced(cut, add)
        if up is not None:
            return up, app_receipt
        general = frame.to_frame().without("receipt")
        for name, value in add:
            general = general.with_header(name, value)  # appended: not there
        return general, app_receipt
