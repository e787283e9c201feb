"""Fuzzing: hypothesis properties and an atheris harness for ``protocol/``, and seeded hostile
byte streams against a running sidecar's STOMP listener and admin port (issue 7).

Keep this file free of imports: ``python -m tests.fuzz.atheris_protocol`` must import
``protocol`` itself, under atheris' instrumentation, before anything else does.
"""
