"""The transports the wire suite runs on.

A test module with ``pytestmark = pytest.mark.usefixtures("each_transport")`` runs each of its
tests once per WebSocket transport of the bus: websockets (the reference) and picows (the
``picows`` extra, skipped with the reason when it is not installed). The fixture sets
``BCPBUS_TEST_TRANSPORT``, which :func:`peers.testing.running_bus` reads.
"""

from __future__ import annotations

import importlib.util

import pytest

HAS_PICOWS = importlib.util.find_spec("picows") is not None

TRANSPORTS = [
    "websockets",
    pytest.param(
        "picows",
        marks=pytest.mark.skipif(
            not HAS_PICOWS, reason="picows is not installed: pip install 'bcpbus[picows]'"
        ),
    ),
]


@pytest.fixture(params=TRANSPORTS)
def each_transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The transport this run of the test talks to the bus over."""
    transport: str = request.param
    monkeypatch.setenv("BCPBUS_TEST_TRANSPORT", transport)
    return transport
