"""The admin plane: HTTP/1.1 (h11 on trio) on the admin port (docs/operations.md).

- ``server``: the server, its bounds and its routes (:class:`~proxy.admin.server.AdminServer`).
- ``http``: one HTTP connection, reading a request's head, the bearer token.
- ``status``: the ``/status`` document.
- ``sse``: ``/events``, the session events as Server-Sent Events.
- ``page``: ``/``, the live page for people (its files in ``page/``), or the text index.
- ``health``: the broker prober and the ``/readyz`` verdict.
- ``actions``: ``POST /actions/...``: evacuate a broker, readmit it, drain the sidecar (the
  admin token always).
"""
