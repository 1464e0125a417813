"""What an approval card shows, from well-formed and malformed stored approvals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from peers.approver import StoredApproval
from peers.console.cards import card

NOW = datetime(2026, 11, 26, 20, 0, tzinfo=UTC)


def stored(request: dict, **fields) -> StoredApproval:
    values = {
        "approval_id": "ap-1",
        "status": "pending",
        "created_ts": "2026-11-26T19:59:00Z",
        "expires_ts": (NOW + timedelta(minutes=5)).isoformat(),
        "request": request,
        **fields,
    }
    return StoredApproval(**values)


def test_an_escalation_shows_the_justification_and_no_answer():
    """An escalation's card carries the controller's reason and what would be asked."""
    request = {
        "kind": "escalation",
        "controller": "main",
        "reader": "researcher",
        "query_id": "q-1",
        "task_id": "t-1",
        "escalation_justification": "Need the whole picture.",
        "spec": {"category": 3, "directive": "Summarize.", "max_words": 50},
    }
    c = card(stored(request), NOW)
    assert c.open and c.kind == "escalation" and c.answer == ()
    assert c.justification == "Need the whole picture." and c.task_id == "t-1"
    assert c.asked == (("directive", "Summarize."), ("length", "up to 50 words"))
    assert c.title.endswith("waits for a decision") and c.outcome is None


def test_a_decided_approval_says_who_decided_and_why():
    """A decided card names the approver, the time and the reason, and is closed."""
    request = {"kind": "response", "response": {"summary": "x"}, "spec": {"category": 3}}
    decided = stored(
        request,
        status="rejected",
        decided_by="human:bob",
        decided_ts="2026-11-26T20:01:00Z",
        decision={"reason": "off topic"},
    )
    c = card(decided, NOW)
    assert not c.open and c.outcome == "Rejected"
    assert (c.decided_by, c.reason) == ("human:bob", "off topic")
    assert c.state != card(stored(request), NOW).state


def test_a_malformed_request_shows_what_is_missing_instead_of_failing():
    """Wrong types and missing parts show as missing or as JSON text, never raise."""
    request = {
        "kind": "response",
        "spec": "not a spec",
        "response": ["not", "a", "mapping"],
        "anomalies": "nope",
        "controller": None,
    }
    c = card(stored(request, expires_ts=(NOW - timedelta(seconds=1)).isoformat()), NOW)
    assert c.asked == () and c.anomalies == () and c.controller == ""
    assert c.answer == (("(as sent)", '["not", "a", "mapping"]'),)
    assert not c.open and c.outcome == "Past its expiry: it counts as rejected"
    fields = {
        "kind": "response",
        "response": {"q": 1},
        "spec": {
            "category": 1,
            "fields": [
                {"name": "n", "type": "integer", "min": 1, "max": 5},
                {"name": "t", "type": "enum", "values": ["a", "b"]},
            ],
        },
    }
    c = card(stored(fields), NOW)
    assert c.asked == (("n", "integer 1..5"), ("t", "one of a | b"))
    assert c.answer == (("q", "1"),)
