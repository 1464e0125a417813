"""The sans-I/O JSON-RPC session, fed strings, checked by what it emits. No event loop."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bus.core.errors import AuthenticationFailed, InvalidParams, RemoteError
from bus.core.protocol import ErrorResponse, Notification, Request, Response, Session


def sent(session: Session) -> list[Any]:
    return [json.loads(text) for text in session.data_to_send()]


def answer_all(session: Session, result: Any = "ok") -> None:
    for event in session.events_received():
        if isinstance(event, Request):
            session.respond(event, result)


def test_request_becomes_event_and_answer_carries_its_id():
    """A request yields one Request event; respond() sends a result with the same id."""
    s = Session()
    s.receive_text('{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}')
    [event] = s.events_received()
    assert event == Request(1, "subtract", [42, 23])
    assert sent(s) == []
    s.respond(event, 19)
    assert sent(s) == [{"jsonrpc": "2.0", "id": 1, "result": 19}]


def test_string_id_is_kept():
    """A string id comes back unchanged."""
    s = Session()
    s.receive_text('{"jsonrpc": "2.0", "method": "m", "id": "abc"}')
    answer_all(s)
    assert sent(s)[0]["id"] == "abc"


def test_notification_is_never_answered():
    """A call without id is a Notification and produces no output."""
    s = Session()
    s.receive_text('{"jsonrpc": "2.0", "method": "update", "params": [1, 2, 3]}')
    assert s.events_received() == [Notification("update", [1, 2, 3])]
    assert sent(s) == []


def test_parse_error_has_null_id():
    """Invalid JSON gets -32700 with id null (JSON-RPC 2.0 §5)."""
    s = Session()
    s.receive_text('{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]')
    [reply] = sent(s)
    assert reply["id"] is None and reply["error"]["code"] == -32700
    assert s.events_received() == []


@pytest.mark.parametrize(
    "frame",
    [
        '{"jsonrpc": "2.0", "method": 1, "params": "bar"}',
        '{"jsonrpc": "1.0", "method": "m", "id": 1}',
        '{"method": "m", "id": 1}',
        '{"jsonrpc": "2.0", "id": 1}',
        '{"jsonrpc": "2.0", "method": "m", "params": 3, "id": 1}',
        '{"jsonrpc": "2.0", "method": "m", "id": 1.5}',
        '{"jsonrpc": "2.0", "method": "m", "id": true}',
        '{"jsonrpc": "2.0", "method": "m", "id": [1]}',
        "1",
        '"text"',
    ],
)
def test_invalid_request(frame):
    """Valid JSON that is not a JSON-RPC request gets -32600 and no event."""
    s = Session()
    s.receive_text(frame)
    [reply] = sent(s)
    assert reply["error"]["code"] == -32600
    assert s.events_received() == []


def test_invalid_request_keeps_a_readable_id():
    """A request that is invalid for another reason is answered with its own id."""
    s = Session()
    s.receive_text('{"jsonrpc": "2.0", "method": "m", "params": 3, "id": 7}')
    assert sent(s)[0]["id"] == 7


def test_empty_batch_is_one_invalid_request():
    """An empty array gets a single -32600, not an empty array."""
    s = Session()
    s.receive_text("[]")
    [reply] = sent(s)
    assert reply["error"]["code"] == -32600 and reply["id"] is None


def test_invalid_batch_is_answered_element_by_element():
    """[1,2,3] gets three -32600 errors in one array."""
    s = Session()
    s.receive_text("[1, 2, 3]")
    [replies] = sent(s)
    assert [r["error"]["code"] for r in replies] == [-32600] * 3


def test_mixed_batch_waits_for_all_answers_then_sends_one_array():
    """The spec's mixed batch: requests, a notification, invalid elements, answered together."""
    s = Session()
    s.receive_text(
        json.dumps(
            [
                {"jsonrpc": "2.0", "method": "sum", "params": [1, 2, 4], "id": "1"},
                {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
                {"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": "2"},
                {"foo": "boo"},
                {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
            ]
        )
    )
    events = s.events_received()
    requests = [e for e in events if isinstance(e, Request)]
    assert [r.id for r in requests] == ["1", "2", "5"]
    assert sum(isinstance(e, Notification) for e in events) == 1
    # Answer out of order; nothing is sent until the last one.
    s.respond(requests[1], 19)
    s.respond_error(requests[2], InvalidParams("nope"))
    assert sent(s) == []
    s.respond(requests[0], 7)
    [replies] = sent(s)
    by_id = {r["id"]: r for r in replies}
    assert by_id["1"]["result"] == 7
    assert by_id["2"]["result"] == 19
    assert by_id["5"]["error"]["code"] == -32602
    assert by_id[None]["error"]["code"] == -32600
    assert len(replies) == 4


def test_all_notification_batch_gets_nothing():
    """A batch of notifications only is answered with nothing at all."""
    s = Session()
    s.receive_text('[{"jsonrpc": "2.0", "method": "a"}, {"jsonrpc": "2.0", "method": "b"}]')
    assert len(s.events_received()) == 2
    assert sent(s) == []


def test_batch_over_limit_is_refused():
    """A batch larger than max_batch is one -32600."""
    s = Session(max_batch=2)
    s.receive_text(json.dumps([{"jsonrpc": "2.0", "method": "m", "id": i} for i in range(3)]))
    [reply] = sent(s)
    assert reply["error"]["code"] == -32600
    assert s.events_received() == []


def test_answering_a_batch_element_twice_is_a_bug():
    """The session refuses a second answer to a batched request."""
    s = Session()
    s.receive_text('[{"jsonrpc": "2.0", "method": "m", "id": 1}]')
    [request] = s.events_received()
    s.respond(request, 1)
    with pytest.raises(RuntimeError):
        s.respond(request, 2)


def test_outgoing_request_ids_are_unique_and_matched():
    """send_request numbers requests; the answers become Response/ErrorResponse events."""
    s = Session()
    a = s.send_request("processMessage", {"x": 1})
    b = s.send_request("processMessage")
    assert a != b
    frames = sent(s)
    assert frames[0] == {"jsonrpc": "2.0", "id": a, "method": "processMessage", "params": {"x": 1}}
    assert "params" not in frames[1]
    s.receive_text(json.dumps({"jsonrpc": "2.0", "id": a, "result": {"processed": True}}))
    s.receive_text(
        json.dumps({"jsonrpc": "2.0", "id": b, "error": {"code": -32002, "message": "no"}})
    )
    first, second = s.events_received()
    assert first == Response(a, {"processed": True})
    assert isinstance(second, ErrorResponse) and isinstance(second.error, AuthenticationFailed)


def test_unknown_error_code_is_kept():
    """An error code the library does not know becomes a RemoteError with that code."""
    s = Session()
    s.receive_text('{"jsonrpc": "2.0", "id": 1, "error": {"code": 42, "message": "odd"}}')
    [event] = s.events_received()
    assert isinstance(event, ErrorResponse) and isinstance(event.error, RemoteError)
    assert event.error.to_error()["code"] == 42


def test_answer_with_unreadable_id_is_dropped():
    """An answer whose id is not a valid id produces no event and no output."""
    s = Session()
    s.receive_text('{"jsonrpc": "2.0", "id": {"x": 1}, "result": 1}')
    assert s.events_received() == [] and sent(s) == []


def test_notification_out():
    """send_notification writes a frame without id."""
    s = Session()
    s.send_notification("hello", [1])
    assert sent(s) == [{"jsonrpc": "2.0", "method": "hello", "params": [1]}]


def test_deep_nesting_is_a_parse_error_not_a_crash():
    """Deep nesting is answered with one error (-32700 or, if the parser copes, -32600)."""
    s = Session()
    s.receive_text("[" * 100_000 + "]" * 100_000)
    [reply] = sent(s)
    first = reply[0] if isinstance(reply, list) else reply
    assert first["error"]["code"] in (-32700, -32600)
    assert s.events_received() == []
