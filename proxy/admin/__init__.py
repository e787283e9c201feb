"""The admin plane: HTTP/1.1 (h11 on trio) on the admin port (docs/operations.md).

- ``server``: the server, its bounds and its routes (:class:`~proxy.admin.server.AdminServer`).
- ``http``: one HTTP connection, reading a request's head, the bearer token.
- ``status``: the ``/status`` document.
- ``sse``: ``/events``, the session events as Server-Sent Events.
- ``health``: the broker prober and the ``/readyz`` verdict.
"""
