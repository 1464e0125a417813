"""Matching answers to the requests waiting for them."""

from __future__ import annotations

import pytest

from bus.core.calls import PendingCalls
from bus.core.errors import InvalidParams
from bus.core.protocol import ErrorResponse, Response


async def test_answers_settle_their_own_futures():
    """A result and an error each reach the request with their id; others are untouched."""
    calls = PendingCalls()
    first, second, third = calls.expect(1), calls.expect("b"), calls.expect(3)
    calls.settle(Response(1, {"ok": True}))
    calls.settle(ErrorResponse("b", InvalidParams("bad")))
    assert await first == {"ok": True}
    with pytest.raises(InvalidParams):
        await second
    assert not third.done() and len(calls) == 3


async def test_late_and_unknown_answers_are_dropped():
    """An answer to a forgotten or unknown id, or a second answer, changes nothing."""
    calls = PendingCalls()
    future = calls.expect(1)
    calls.settle(Response(1, "first"))
    calls.settle(Response(1, "second"))
    calls.settle(Response(99, "nobody"))
    assert await future == "first"
    calls.forget(1)
    assert len(calls) == 0


async def test_fail_all():
    """When the connection ends every outstanding call fails with the given error."""
    calls = PendingCalls()
    futures = [calls.expect(n) for n in range(3)]
    calls.settle(Response(0, "done"))
    calls.fail_all(ConnectionError("gone"))
    assert await futures[0] == "done"
    for future in futures[1:]:
        with pytest.raises(ConnectionError):
            await future
    assert len(calls) == 0
