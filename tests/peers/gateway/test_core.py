"""The gateway's core without an event loop: query requests in, admissions or refusals out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from peers.gateway.core import (
    GATEWAY_CLIENT_ID,
    Admitted,
    GatewayCore,
    Refusal,
    Refused,
    channel_of,
    parse,
)
from peers.gateway.events import Commit, MessageReceived, Record, Respond, Send
from peers.gateway.state import GatewayState
from schemas.agents import build_channels, load_agents
from schemas.bcp import BcpQueryFailed, BcpResponse

from .test_flows import CAT1, CAT2, CAT3, agents

TOPIC = "bcp:main:researcher"
KEY = ("main", "researcher")


@dataclass(frozen=True)
class Settings:
    """The core's timeouts, short and round so that tests can name them."""

    query_ttl: float = 300.0
    max_retries: int = 2
    approval_timeout: float = 600.0
    outbox_ttl: float = 3600.0


SETTINGS = Settings()


@pytest.fixture
def core(tmp_path: Path) -> GatewayCore:
    channels = build_channels(load_agents(agents(tmp_path, max_category=2, budget=500)))
    return GatewayCore(channels, GatewayState(), SETTINGS)


def request(content: dict[str, Any], *, topic: str = TOPIC, sender: str = "agent:main") -> Any:
    return MessageReceived("m1", sender, topic, "bcp_query_request", content)


def refused(outcome: Admitted | Refused) -> tuple[str, Any]:
    """Return the refusal's reason and what was sent to the controller, checking the order."""
    assert isinstance(outcome, Refused)
    row, commit, *sent, respond = outcome.actions
    assert isinstance(row, Record) and row.event == "bcp_query_refused"
    assert row.actor == GATEWAY_CLIENT_ID and row.message_id == "m1"
    assert commit == Commit()
    assert isinstance(respond, Respond) and not respond.ok and respond.status == row.status
    return respond.status, sent


def test_a_valid_request_is_admitted_and_nothing_is_reserved(core):
    """A Cat-1 request passes every check; the ledger and the used ids stay untouched."""
    outcome = core.queries.check(request({"query_id": "q1", **CAT1}))
    assert isinstance(outcome, Admitted)
    assert outcome.request.query_id == "q1" and not outcome.escalation
    assert outcome.bits == pytest.approx(6.9, abs=0.1)
    assert core.state.ledger.used(KEY) == 0 and not core.state.used_query_ids


def test_a_refusal_is_recorded_committed_then_sent_then_replied(core):
    """A refusal is a row, a commit, a bcp_query_failed to the controller, then the reply."""
    core.state.used_query_ids.add(("main", "q1"))
    reason, [send] = refused(core.queries.check(request({"query_id": "q1", **CAT1})))
    assert reason == "duplicate_query_id"
    assert isinstance(send, Send) and send.topic == "agent:main"
    assert send.type == "bcp_query_failed" and isinstance(send.content, BcpQueryFailed)
    assert send.content.query_id == "q1"


@pytest.mark.parametrize(
    ("content", "topic", "sender", "reason"),
    [
        ({"query_id": "q1", **CAT1}, "bcp:main", "agent:main", "unknown_channel"),
        ({"query_id": "q1", **CAT1}, "bcp:main:nobody", "agent:main", "unknown_channel"),
        ({"query_id": "q1", **CAT1}, TOPIC, "agent:researcher", "not_channel_controller"),
        ({"query_id": "q1", "category": 1}, TOPIC, "agent:main", "invalid_spec"),
        ({"query_id": "q1", **CAT3}, TOPIC, "agent:main", "category_not_allowed"),
        ({"query_id": "q1", "category": 9}, TOPIC, "agent:main", "invalid_spec"),
    ],
)
def test_requests_on_the_wrong_channel_or_with_a_bad_spec_are_refused(
    core, content, topic, sender, reason
):
    """Unknown channels, the wrong sender, a broken spec, a category too high are refused."""
    assert refused(core.queries.check(request(content, topic=topic, sender=sender)))[0] == (reason)


def test_an_unreadable_or_missing_query_id_is_not_echoed(core):
    """Without a usable query_id the controller learns the refusal from the reply alone."""
    for content in ({**CAT1}, {"query_id": "bad id!", **CAT1}):
        reason, sent = refused(core.queries.check(request(content)))
        assert reason == "invalid_spec" and sent == []


def test_budget_and_cat2_limits_refuse(core):
    """A query over the budget, or a Cat-2 query past max_cat2_queries, is refused."""
    core.state.ledger.charge(KEY, 499)
    reason, _ = refused(core.queries.check(request({"query_id": "q1", **CAT1})))
    assert reason == "budget_exhausted"
    core.state.ledger.reset(KEY)
    for _ in range(10):
        core.state.ledger.charge(KEY, 0, cat2=True)
    reason, _ = refused(core.queries.check(request({"query_id": "q2", **CAT2})))
    assert reason == "cat2_limit_reached"


def test_escalation_needs_a_justification_and_cat3_needs_a_human(tmp_path):
    """Raising a task's category needs a reason; an escalation into Cat-3 waits for a human."""
    channels = build_channels(load_agents(agents(tmp_path)))
    core = GatewayCore(channels, GatewayState(), SETTINGS)
    core.state.tasks.record(KEY, "t1", 1)
    ask = {"query_id": "q2", "task_id": "t1"}
    reason, _ = refused(core.queries.check(request({**ask, **CAT2})))
    assert reason == "escalation_requires_justification"
    justified = {**ask, "escalation_justification": "need it"}
    cat2 = core.queries.check(request({**justified, **CAT2}))
    assert isinstance(cat2, Admitted) and not cat2.escalation
    cat3 = core.queries.check(request({**justified, **CAT3}))
    assert isinstance(cat3, Admitted) and cat3.escalation


def test_a_reader_is_checked_as_the_channel_reader(core):
    """channel_of accepts the channel's reader and refuses another agent as not its reader."""
    answer = MessageReceived("m2", "agent:researcher", TOPIC, "bcp_response", {})
    assert channel_of(core.channels, answer, sender_is="reader").key == KEY
    stranger = MessageReceived("m3", "agent:main", TOPIC, "bcp_response", {})
    with pytest.raises(Refusal) as caught:
        channel_of(core.channels, stranger, sender_is="reader")
    assert caught.value.reason == "not_channel_reader"


def test_parse_names_the_content_when_a_whole_message_is_wrong():
    """A model-level error has no field path, so the detail names the content."""
    with pytest.raises(Refusal) as caught:
        parse(BcpResponse, {"response": 1}, "invalid_message")
    assert caught.value.reason == "invalid_message"
    assert caught.value.detail.startswith("content: ")
