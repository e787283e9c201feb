"""Fixtures of the Session unit tests (tests/proxy/test_session_*.py): the scripted network."""

from __future__ import annotations

import pytest
import trio

from tests.proxy.scripted_broker import Network


@pytest.fixture
def network(nursery: trio.Nursery) -> Network:
    """Scripted brokers reached through ``Network.open_stream``; their links run in the
    test's nursery (cancelled when the test ends)."""
    return Network(nursery)
