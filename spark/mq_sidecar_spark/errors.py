"""The errors of the ``stomp`` data source: one class per way a write can fail.

An :class:`OptionError` is raised on the driver, when Spark asks the data source for its writer
(``save()`` / ``start()`` fail at once, before any task runs). The others are raised in a task on
an executor; Spark fails the task with them (and retries it up to ``spark.task.maxFailures``
times, the retry sending the same ids), then fails the job with the last attempt's traceback,
which holds the message: the driver sees ``StompErrorFrame: ...`` with the sidecar's or the
broker's ERROR text.

The stream read (``stream=true``) adds :class:`StreamOffsetError` (a checkpoint or an offset
that does not fit the stream, on the driver) and :class:`StreamDataLossError` (offsets the
stream's retention removed, with ``failOnDataLoss=true``).

The streaming read fails with one class, :class:`StompReadError`, on the driver (the reader
turns the connection's errors above into it, :mod:`mq_sidecar_spark.reader`).
"""

from __future__ import annotations

__all__ = [
    "OptionError",
    "RowError",
    "StompConnectError",
    "StompConnectionLost",
    "StompErrorFrame",
    "StompReadError",
    "StompTimeout",
    "StompWriteError",
    "StreamDataLossError",
    "StreamOffsetError",
]


class OptionError(ValueError):
    """A missing, unknown or bad option of the data source (names the option and what it
    accepts; an unknown option's message lists the known ones)."""


class StompWriteError(RuntimeError):
    """A task could not get its partition confirmed; the base of the errors below."""


class StompConnectError(StompWriteError):
    """No STOMP session with the sidecar: nothing listens at ``host:port`` (the message names
    both and the socket error), or the CONNECT was not answered within ``timeout`` seconds."""


class StompErrorFrame(StompWriteError):
    """The sidecar sent an ERROR frame: its own (a limit, ``call_timeout``, a failover it gave
    up on) or the broker's, passed on unchanged (docs/behaviour.md, "Transparency first").

    Attributes:
        message: the ERROR's ``message`` header ('' when it had none).
        body: its body as text ('' when empty).
    """

    def __init__(self, text: str, message: str, body: str) -> None:
        super().__init__(text)
        self.message = message
        self.body = body


class StompTimeout(StompWriteError):
    """A wait passed ``timeout`` seconds: a receipt not answered, or one SEND not written to
    the socket (the sidecar stopped reading)."""


class StompConnectionLost(StompWriteError):
    """The connection to the sidecar closed before every receipt arrived, with no ERROR."""


class RowError(StompWriteError):
    """One row cannot be sent: a null id column, a null or mistyped body column, a value with
    no JSON form. The message names the row (its id, or its partition and position)."""


class StompReadError(RuntimeError):
    """The STOMP session of the streaming reader failed (the message says how: no sidecar at
    ``host:port``, an ERROR from the sidecar or the broker, no answer within ``timeout``
    seconds, the connection lost)."""


class StreamOffsetError(ValueError):
    """An offset of a stream read does not fit the stream (raised on the driver, before a task
    runs): a checkpoint written by the queue reader or by a read of another stream, or a
    checkpointed offset beyond the stream's tail (the stream was deleted and declared again).
    The message names the offset, the stream, and the checkpoint's own."""


class StreamDataLossError(RuntimeError):
    """With ``failOnDataLoss=true`` (the default), offsets the query expects are no longer in
    the stream: its retention (``x-max-length-bytes``, ``x-max-age``) removed them. Raised on
    the driver when a batch is planned, or in a task when retention removed them meanwhile;
    the message names the offsets lost and the option."""
