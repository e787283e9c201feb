"""The legs: the STOMP connections a session holds, and how they are opened.

- ``stream``: a STOMP connection over a trio stream (either leg): framing I/O, queued writes,
  heart-beats and the peer's silence (:class:`~proxy.legs.stream.FrameStream`).
- ``broker``: the broker leg: CONNECT/CONNECTED, :class:`~proxy.legs.broker.Upstream`, the
  errors of a failed connect (:func:`~proxy.legs.broker.open_upstream`).
- ``opening``: opening the byte stream to a broker (TCP, TLS) and the one-line reason when it
  fails (:class:`~proxy.legs.opening.BrokerStreams`).
- ``connect_frame``: the CONNECT frame sent to a broker (pure).
- ``dialect``: what a broker does differently, read off its CONNECTED once (pure:
  :class:`~proxy.legs.dialect.BrokerDialect`).
- ``tls``: TLS contexts, certificate records and the diagnosis of a failed handshake.
- ``memory``: an app leg's reads wait for the process's memory budget (``max_memory_bytes``:
  :class:`~proxy.legs.memory.MemoryBudgetGate`).

This file imports nothing: the pure modules here may be imported by pure code.
"""
