"""The gateway's core without an event loop: query requests in, admissions or refusals out."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st

from peers.gateway.core import (
    APPROVAL_TOPIC,
    GATEWAY_CLIENT_ID,
    Admitted,
    GatewayCore,
    Refusal,
    Refused,
    channel_of,
    parse,
)
from peers.gateway.core.frames import iso, question, wire
from peers.gateway.core.outcomes import FAILURE_OUTCOMES, OutcomeCharge, outcome_charge
from peers.gateway.events import (
    CancelTimer,
    Commit,
    MessageReceived,
    PeerJoined,
    PeerLeft,
    Record,
    Respond,
    Send,
    Sent,
    SetTimer,
    Spawn,
    TimerFired,
)
from peers.gateway.state import GatewayState, Held, Orphans
from schemas.agents import build_channels, load_agents
from schemas.bcp import UNTRUSTED_NOTICE, BcpQuery, BcpQueryFailed, BcpResponse, QuerySpec

from .test_flows import CAT1, CAT1_BITS, CAT2, CAT3, agents

TOPIC = "bcp:main:researcher"
DELIVERY = "bcp_response_delivery"
KEY = ("main", "researcher")
FAILED = 1 + math.log2(len(FAILURE_OUTCOMES))
"""What any failure of a query the reader got costs: 3.585 bits."""


@dataclass(frozen=True)
class Settings:
    """The core's timeouts, short and round so that tests can name them."""

    query_ttl: float = 300.0
    max_retries: int = 2
    approval_timeout: float = 600.0
    outbox_ttl: float = 3600.0
    screener_timeout: float = 10.0


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


# A shell without I/O, to drive the core flow by flow.

ANSWER1 = {"has_pricing": True, "tier": "pro", "rating": 4, "region": "eu"}
ANSWER3 = {"summary": "Short."}
FLAGGED = {"company": "acme.com", "founded": "1998-04-01"}


class Clock:
    """Seconds that move only when a test moves them."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Shell:
    """Carry out a core's actions like the gateway does, without I/O; nobody at ``offline``."""

    def __init__(self, core: GatewayCore, *offline: str) -> None:
        self.core = core
        self.offline = set(offline)

    def run(self, actions: Any) -> list[Any]:
        queue, done = deque(actions), []
        while queue:
            action = queue.popleft()
            if isinstance(action, Spawn):
                queue.extendleft(reversed(action.actions))
                continue
            done.append(action)
            if isinstance(action, Send) and action.token is not None:
                delivered = 0 if action.topic in self.offline else 1
                queue.extendleft(reversed(self.core.handle(Sent(action.token, delivered))))
        return done

    def handle(self, event: Any) -> list[Any]:
        return self.run(self.core.handle(event))


def show(actions: list[Any]) -> list[str]:
    """Return the actions in short words, in order."""
    words = []
    for action in actions:
        match action:
            case Record():
                words.append(f"record {action.event} {action.status}")
            case Commit():
                words.append("commit")
            case Send():
                words.append(f"send {action.type} to {action.topic}")
            case Respond():
                words.append(f"reply {action.status}")
            case SetTimer():
                words.append(f"set {action.key[0]}")
            case CancelTimer():
                words.append(f"cancel {action.key[0]}")
    return words


def sent(actions: list[Any], message_type: str) -> Any:
    """Return the content of the one message of ``message_type`` sent."""
    [content] = [a.content for a in actions if isinstance(a, Send) and a.type == message_type]
    return content


def make(tmp_path: Path, *offline: str, **agent_options: Any) -> tuple[GatewayCore, Shell, Clock]:
    clock = Clock()
    channels = build_channels(load_agents(agents(tmp_path, **agent_options)))
    core = GatewayCore(channels, GatewayState(), SETTINGS, clock=clock)
    return core, Shell(core, *offline), clock


def ask(shell: Shell, query_id: str = "q1", spec: dict[str, Any] = CAT1, **more: Any) -> list[Any]:
    content = {"query_id": query_id, **spec, **more}
    return shell.handle(MessageReceived("m1", "agent:main", TOPIC, "bcp_query_request", content))


def answer(shell: Shell, response: Any, query_id: str = "q1", **more: Any) -> list[Any]:
    content = {"query_id": query_id, "response": response, **more}
    event = MessageReceived("m2", "agent:researcher", TOPIC, "bcp_response", content)
    return shell.handle(event)


def decide(shell: Shell, approval_id: str, decision: str, **more: Any) -> list[Any]:
    content = {"approval_id": approval_id, "decision": decision, **more}
    event = MessageReceived("m3", "human:bob", APPROVAL_TOPIC, "bcp_approval_decision", content)
    return shell.handle(event)


def approval_of(actions: list[Any]) -> str:
    return str(sent(actions, "bcp_approval_request").approval_id)


# Queries: the reader asked, each outcome charged


def test_an_admitted_query_is_charged_committed_then_sent_and_timed(tmp_path):
    """The query's rows are committed before bcp_query; its timer runs from then, and the
    controller's reply is not held back by the reader's (the send is spawned after it)."""
    core, shell, clock = make(tmp_path)
    request = {"query_id": "q1", **CAT1}
    raw = core.handle(MessageReceived("m1", "agent:main", TOPIC, "bcp_query_request", request))
    assert isinstance(raw[-1], Spawn) and isinstance(raw[-2], Respond)
    actions = shell.run(raw)
    assert show(actions) == [
        "record bcp_query_accepted accepted",
        "record bcp_bits_charged charged",
        "commit",
        "set query",
        "reply accepted",
        "send bcp_query to agent:researcher",
    ]
    assert actions[3] == SetTimer(("query", "main", "q1"), SETTINGS.query_ttl)
    assert sent(actions, "bcp_query").expires_at.timestamp() == clock.now + SETTINGS.query_ttl
    assert actions[1].payload["bits"] == pytest.approx(CAT1_BITS + 1)
    assert actions[1].payload["answer_bits"] == pytest.approx(CAT1_BITS)
    assert core.state.ledger.used(KEY) == pytest.approx(CAT1_BITS + 1)
    assert show(ask(shell)) == [
        "record bcp_query_refused duplicate_query_id",
        "commit",
        "send bcp_query_failed to agent:main",
        "reply duplicate_query_id",
    ]


def test_a_reader_that_takes_nothing_pays_for_a_failure_and_the_query_fails(tmp_path):
    """No reader online: the controller learns it, so the query is settled to a failure's bits."""
    core, shell, _ = make(tmp_path, "agent:researcher")
    actions = ask(shell, spec=CAT2)
    assert show(actions)[3:] == [
        "set query",
        "reply accepted",
        "send bcp_query to agent:researcher",
        "cancel query",
        "record bcp_query_failed reader_unavailable",
        "commit",
        "record bcp_bits_charged charged",  # settled as the failure leaves, not before
        "send bcp_query_failed to agent:main",
    ]
    charge = outcome_charge(actions[1].payload["answer_bits"])
    assert actions[9].payload["bits"] == pytest.approx(charge.failed - charge.reserve)
    assert actions[9].payload["outcome"] == "reader_unavailable"
    assert core.state.ledger.used(KEY) == pytest.approx(FAILED)
    assert core.state.ledger.cat2_used(KEY) == 1
    assert ("main", "q1") in core.state.used_query_ids and not core.ctx.pending


# Outcomes: what each one costs

BOOLEAN = {"category": 1, "fields": [{"name": "ok", "type": "boolean"}]}


@given(st.floats(min_value=0, max_value=10_000, allow_nan=False))
def test_outcome_charges_are_a_prefix_code(answer_bits):
    """Deliveries and failures together satisfy Kraft's inequality; the reserve covers both."""
    charge = outcome_charge(answer_bits)
    kraft = 2 ** (answer_bits - charge.delivered) + len(FAILURE_OUTCOMES) * 2**-charge.failed
    assert kraft <= 1 + 1e-9
    assert charge.reserve >= max(charge.delivered, charge.failed)
    assert charge == OutcomeCharge(answer_bits, answer_bits + 1, FAILED)


def reject(shell: Shell) -> list[Any]:
    return decide(shell, approval_of(answer(shell, ANSWER3)), "reject")


def expire_approval(shell: Shell) -> list[Any]:
    return shell.handle(TimerFired(("approval", approval_of(answer(shell, ANSWER3)))))


def retry_out(shell: Shell) -> list[Any]:
    return [a for _ in range(3) for a in answer(shell, {"tier": "gold"})]


@pytest.mark.parametrize(
    ("spec", "offline", "outcome", "expected"),
    [
        (CAT1, (), lambda shell: answer(shell, ANSWER1), CAT1_BITS + 1),
        (BOOLEAN, (), lambda shell: answer(shell, {"ok": True}), 2.0),
        (CAT1, ("agent:researcher",), lambda shell: [], FAILED),
        (CAT1, (), lambda shell: shell.handle(TimerFired(("query", "main", "q1"))), FAILED),
        (CAT1, (), retry_out, FAILED),
        (CAT3, (), reject, FAILED),
        (CAT3, (), expire_approval, FAILED),
    ],
    ids=[
        "delivered",
        "delivered-boolean",
        "unavailable",
        "timeout",
        "retries",
        "rejected",
        "expired",
    ],
)
def test_each_outcome_is_charged_what_it_carries(tmp_path, spec, offline, outcome, expected):
    """A delivery costs its answer's bits plus one, any failure one plus log2 of the failures."""
    core, shell, _ = make(tmp_path, *offline)
    rows = [*ask(shell, spec=spec), *outcome(shell)]
    assert not core.ctx.pending
    charges = [a.payload["bits"] for a in rows if isinstance(a, Record) and a.event.endswith("ged")]
    assert sum(charges) == pytest.approx(expected)
    assert core.state.ledger.used(KEY) == pytest.approx(expected)
    assert all(bits < 0 for bits in charges[1:]), "only the reserve is charged; then refunds"


def test_a_refusal_before_the_reader_has_the_query_is_free(tmp_path):
    """Admission refusals, rejected escalations and a budget gone during approval cost nothing."""
    core, shell, _ = make(tmp_path)
    assert show(ask(shell, spec={"category": 1}))[-1] == "reply invalid_spec"
    assert core.state.ledger.used(KEY) == 0
    decide(shell, escalate(shell), "reject")
    assert core.state.ledger.used(KEY) == pytest.approx(CAT1_BITS + 1)
    ask(shell, "q3", CAT1, task_id="t2")
    ask(shell, "q4", CAT3, task_id="t2", escalation_justification="need the gist")
    [approval_id] = core.ctx.approvals
    core.state.ledger.charge(KEY, 2000)
    actions = decide(shell, approval_id, "approve")
    assert "record bcp_bits_charged charged" not in show(actions)


def test_a_reader_declining_on_purpose_pays_for_every_bit_it_moves(tmp_path):
    """Answering for a 1 and declining for a 0 moves 40 bits for at least 40 bits charged."""
    secret = [(0xA5C3F00F1E >> i) & 1 for i in range(40)]
    core, shell, _ = make(tmp_path, budget=1000)
    learned = []
    for i, bit in enumerate(secret):
        actions = ask(shell, f"q{i}", BOOLEAN)
        if bit:
            actions = answer(shell, {"ok": True}, f"q{i}")
        else:
            actions = shell.handle(TimerFired(("query", "main", f"q{i}")))
        learned.append(1 if "send bcp_response_delivery to agent:main" in show(actions) else 0)
    assert learned == secret
    assert core.state.ledger.used(KEY) >= len(secret)


def test_a_send_outcome_nobody_waits_for_changes_nothing(tmp_path):
    """A Sent with an unknown token returns no actions."""
    core, _, _ = make(tmp_path)
    assert core.handle(Sent(99, 1)) == []


# Answers and retries


def test_a_valid_answer_is_confirmed_to_the_reader_then_delivered(tmp_path):
    """The verdict goes back correlated; the delivery is logged once the controller got it."""
    core, shell, _ = make(tmp_path)
    ask(shell)
    actions = answer(shell, ANSWER1)
    assert show(actions) == [
        "record bcp_validation pass",
        "commit",
        "send bcp_validation_result to agent:researcher",
        "cancel query",
        "send bcp_response_delivery to agent:main",
        "record bcp_delivered delivered",
        "commit",
        "reply delivered",
    ]
    assert actions[2].correlation_id == "m2" and actions[2].content.success
    assert sent(actions, "bcp_response_delivery")["response"] == ANSWER1
    assert not core.ctx.pending


def test_text_is_delivered_marked_untrusted_with_its_provenance(tmp_path):
    """A Cat-2 answer carries untrusted, the notice and its provenance; a Cat-1 one does not."""
    _, shell, _ = make(tmp_path)
    ask(shell, "q2", CAT2)
    delivery = sent(answer(shell, {"company": "Acme", "founded": "1998-04-01"}, "q2"), DELIVERY)
    assert delivery["untrusted"] is True and delivery["notice"] == UNTRUSTED_NOTICE
    assert delivery["provenance"] == {"channel": TOPIC, "reader": "researcher", "query_id": "q2"}
    ask(shell)
    delivery = sent(answer(shell, ANSWER1), DELIVERY)
    assert not {"untrusted", "notice", "provenance"} & delivery.keys()


def test_invalid_answers_count_down_retries_then_fail_the_query(tmp_path):
    """Each invalid answer says how many tries are left; the last one ends the query."""
    _, shell, _ = make(tmp_path)
    ask(shell)
    for left in (2, 1):
        actions = answer(shell, {"tier": "gold"})
        assert sent(actions, "bcp_validation_result").retries_left == left
        assert show(actions)[-1] == "reply validation_failed"
    actions = answer(shell, {"tier": "gold"})
    assert show(actions) == [
        "record bcp_validation fail",
        "commit",
        "send bcp_validation_result to agent:researcher",
        "cancel query",
        "record bcp_query_failed retries_exhausted",
        "commit",
        "record bcp_bits_charged charged",
        "send bcp_query_failed to agent:main",
        "reply retries_exhausted",
    ]
    assert show(answer(shell, ANSWER1))[-1] == "reply unknown_query"


def test_a_response_from_outside_the_channel_is_logged_as_a_failed_validation(tmp_path):
    """Without a channel the verdict is logged; with one but a broken message, it is not."""
    _, shell, _ = make(tmp_path)
    stranger = MessageReceived("m2", "agent:main", TOPIC, "bcp_response", {"query_id": "bad id!"})
    actions = shell.handle(stranger)
    assert show(actions) == [
        "record bcp_validation fail",
        "commit",
        "send bcp_validation_result to agent:main",
        "reply not_channel_reader",
    ]
    assert "query_id" not in sent(actions, "bcp_validation_result").model_fields_set
    broken = MessageReceived("m4", "agent:researcher", TOPIC, "bcp_response", {"response": 1})
    actions = shell.handle(broken)
    assert show(actions) == [
        "commit",
        "send bcp_validation_result to agent:researcher",
        "reply invalid_message",
    ]


# Expiry


def test_a_query_with_no_valid_answer_expires_once(tmp_path):
    """The query timer fails it with timeout; a second firing finds nothing to do."""
    _, shell, _ = make(tmp_path)
    ask(shell)
    actions = shell.handle(TimerFired(("query", "main", "q1")))
    assert show(actions) == [
        "record bcp_expired timeout",
        "cancel query",
        "record bcp_query_failed timeout",
        "commit",
        "record bcp_bits_charged charged",
        "send bcp_query_failed to agent:main",
    ]
    assert shell.handle(TimerFired(("query", "main", "q1"))) == []


def test_a_query_under_review_does_not_expire_on_its_own_timer(tmp_path):
    """Once a human reviews the answer, only the approval's timeout ends the query."""
    _, shell, _ = make(tmp_path)
    ask(shell, spec=CAT3)
    actions = answer(shell, ANSWER3)
    assert show(actions)[-1] == "reply held_for_approval"
    assert shell.handle(TimerFired(("query", "main", "q1"))) == []


# Approvals and decisions


def test_a_cat3_answer_waits_for_a_human_and_is_delivered_on_approval(tmp_path):
    """The approval is committed before it is sent and timed; approval delivers the answer."""
    core, shell, _ = make(tmp_path)
    ask(shell, spec=CAT3)
    actions = answer(shell, ANSWER3)
    assert show(actions)[3:] == [
        "record bcp_approval_requested pending",
        "commit",
        "set approval",
        "send bcp_approval_request to system:approval",
        "reply held_for_approval",
    ]
    approval_id = approval_of(actions)
    actions = decide(shell, approval_id, "approve")
    assert show(actions) == [
        "cancel approval",
        "record bcp_approval_decided approved",
        "commit",
        "cancel query",
        "record bcp_bits_charged charged",
        "send bcp_response_delivery to agent:main",
        "record bcp_delivered delivered",
        "commit",
        "reply approved",
    ]
    assert actions[1].actor == "human:bob"
    assert core.state.decided.get(approval_id).status == "approved"
    assert decide(shell, approval_id, "reject")[-1].status == "already_decided"


def test_a_review_opens_only_once_the_reader_has_its_verdict(tmp_path):
    """An approver joining before the verdict is sent is not sent the approval twice."""
    core, shell, _ = make(tmp_path)
    ask(shell, spec=CAT3)
    content = {"query_id": "q1", "response": ANSWER3}
    actions = core.handle(MessageReceived("m2", "agent:researcher", TOPIC, "bcp_response", content))
    *_, verdict, _reply = actions
    assert not core.ctx.approvals and core.ctx.pending[("main", "q1")].state == "approving"
    assert shell.handle(PeerJoined("human:bob", "system:bus")) == [Respond(True)]
    assert show(shell.run([verdict]))[-1] == "send bcp_approval_request to system:approval"
    assert len(core.ctx.approvals) == 1


def test_a_rejected_answer_fails_the_query(tmp_path):
    """A human's rejection ends the query with approval_rejected."""
    _, shell, _ = make(tmp_path)
    ask(shell, spec=CAT3)
    actions = decide(shell, approval_of(answer(shell, ANSWER3)), "reject")
    assert "record bcp_query_failed approval_rejected" in show(actions)


def test_an_edit_is_validated_again_and_only_for_a_response(tmp_path):
    """An edit that fails validation is refused; a valid one is delivered as edited."""
    _, shell, _ = make(tmp_path)
    ask(shell, spec=CAT3)
    approval_id = approval_of(answer(shell, ANSWER3))
    refused = decide(shell, approval_id, "edit", edited_response={"summary": 7})
    assert refused[-1].status == "invalid_edit"
    actions = decide(shell, approval_id, "edit", edited_response={"summary": "Shorter."})
    assert sent(actions, "bcp_response_delivery")["response"] == {"summary": "Shorter."}
    assert actions[-1].status == "edited"


def test_decisions_that_match_no_approval_are_refused(tmp_path):
    """A malformed decision and one on an unknown approval are refused without a row."""
    _, shell, _ = make(tmp_path)
    bad = MessageReceived("m3", "human:bob", APPROVAL_TOPIC, "bcp_approval_decision", {})
    assert shell.handle(bad) == [Respond(False, "invalid_decision", "not a bcp_approval_decision")]
    assert show(decide(shell, "ap-000000000000", "approve")) == ["reply unknown_approval"]


def test_an_undecided_approval_expires_and_its_query_fails(tmp_path):
    """The approval timer decides it as expired by the gateway; a late firing does nothing."""
    core, shell, _ = make(tmp_path)
    ask(shell, spec=CAT3)
    approval_id = approval_of(answer(shell, ANSWER3))
    actions = shell.handle(TimerFired(("approval", approval_id)))
    assert actions[1].status == "expired" and actions[1].actor == GATEWAY_CLIENT_ID
    assert "record bcp_query_failed approval_rejected" in show(actions)
    assert core.state.decided.get(approval_id).note == "no decision in time"
    assert shell.handle(TimerFired(("approval", approval_id))) == []


# Escalation


def escalate(shell: Shell) -> str:
    ask(shell, "q1", CAT1, task_id="t1")
    actions = ask(shell, "q2", CAT3, task_id="t1", escalation_justification="need the gist")
    assert show(actions) == [
        "record bcp_approval_requested pending",
        "commit",
        "set approval",
        "send bcp_approval_request to system:approval",
        "reply accepted",
    ]
    request = sent(actions, "bcp_approval_request")
    assert request.kind == "escalation" and request.from_category == 1
    return request.approval_id


def test_an_approved_escalation_asks_the_reader(tmp_path):
    """Approval sends the Cat-3 query to the reader; the decision's reply is its status."""
    core, shell, _ = make(tmp_path)
    actions = decide(shell, escalate(shell), "approve")
    assert "send bcp_query to agent:researcher" in show(actions)
    assert actions[-1] == Respond(True, "approved")
    assert ("main", "q2") in core.ctx.pending


def test_a_rejected_escalation_fails_and_burns_its_query_id(tmp_path):
    """Rejection fails the query with escalation_rejected; its id cannot be used again."""
    core, shell, _ = make(tmp_path)
    actions = decide(shell, escalate(shell), "reject")
    assert "record bcp_query_failed escalation_rejected" in show(actions)
    assert ("main", "q2") in core.state.used_query_ids


def test_an_escalation_is_checked_against_the_budget_again_on_approval(tmp_path):
    """Bits spent while the human decided can fail an approved escalation."""
    core, shell, _ = make(tmp_path)
    approval_id = escalate(shell)
    core.state.ledger.charge(KEY, 2000)
    actions = decide(shell, approval_id, "approve")
    assert "record bcp_query_failed budget_exhausted" in show(actions)


def test_only_a_response_can_be_edited(tmp_path):
    """An edit of an escalation is refused as invalid_edit."""
    _, shell, _ = make(tmp_path)
    actions = decide(shell, escalate(shell), "edit", edited_response={"summary": "x"})
    assert actions == [Respond(False, "invalid_edit", "only a response can be edited, with text")]


# Subscription pushes and their rate limits

SUBSCRIPTIONS = """    subscriptions:
      - id: alerts
        category: 1
        fields:
          - {name: urgent, type: boolean}
        min_interval_s: 3600
      - id: hourly
        category: 1
        fields:
          - {name: level, type: integer, min: 0, max: 7}
      - id: digest
        category: 3
        directive: Summarize what changed.
        max_words: 20
"""


def pushing(tmp_path: Path, *offline: str) -> tuple[GatewayCore, Shell, Clock]:
    return make(tmp_path, *offline, subscriptions=SUBSCRIPTIONS)


def push(shell: Shell, sid: str, response: Any, controller: str = "main") -> list[Any]:
    content = {"subscription_id": sid, "controller": controller, "response": response}
    return shell.handle(MessageReceived("m5", "agent:researcher", TOPIC, "bcp_response", content))


def test_a_valid_push_is_charged_and_committed_before_it_is_delivered(tmp_path):
    """The push's rows are durable first, its charge as it leaves; the reader's verdict says
    it was delivered."""
    core, shell, _ = pushing(tmp_path)
    actions = push(shell, "alerts", {"urgent": True})
    assert show(actions) == [
        "record bcp_validation pass",
        "record bcp_push_received accepted",
        "commit",
        "record bcp_bits_charged charged",
        "commit",
        "send bcp_response_delivery to agent:main",
        "record bcp_delivered delivered",
        "commit",
        "commit",
        "send bcp_validation_result to agent:researcher",
        "reply delivered",
    ]
    assert sent(actions, "bcp_response_delivery")["subscription_id"] == "alerts"
    # The value's bit, and one that a push came at all (no grid here: no slot).
    assert core.state.ledger.used(KEY) == 2


def test_pushes_past_the_rate_limit_or_the_budget_are_refused_with_the_reason(tmp_path):
    """min_interval_s and the channel's budget each refuse a push, with a detail in the row."""
    core, shell, clock = pushing(tmp_path)
    push(shell, "alerts", {"urgent": True})
    clock.now += 60
    actions = push(shell, "alerts", {"urgent": False})
    assert show(actions) == [
        "record bcp_push_refused rate_limited",
        "commit",
        "send bcp_validation_result to agent:researcher",
        "reply rate_limited",
    ]
    assert "3600" in actions[0].payload["detail"]
    core.state.ledger.charge(KEY, 2000)
    assert show(push(shell, "hourly", {"level": 3}))[-1] == "reply budget_exhausted"


def test_a_push_must_name_a_declared_subscription_of_its_controller(tmp_path):
    """An unknown subscription, or another controller's, is refused as subscription_not_found."""
    _, shell, _ = pushing(tmp_path)
    for sid, controller in (("nope", "main"), ("alerts", "someone")):
        actions = push(shell, sid, {"urgent": True}, controller)
        assert show(actions)[0] == "record bcp_push_refused subscription_not_found"
        assert "detail" not in actions[0].payload


def test_an_invalid_push_is_refused_and_not_charged(tmp_path):
    """A push that fails validation costs nothing and says why."""
    core, shell, _ = pushing(tmp_path)
    actions = push(shell, "hourly", {"level": 99})
    assert show(actions)[:2] == [
        "record bcp_validation fail",
        "record bcp_push_refused validation_failed",
    ]
    assert core.state.ledger.used(KEY) == 0


def test_a_cat3_push_waits_for_a_human_and_a_rejection_tells_the_reader(tmp_path):
    """Approved, the push is delivered; rejected, the reader gets approval_rejected."""
    _, shell, clock = pushing(tmp_path)
    actions = push(shell, "digest", {"summary": "Two changes."})
    assert show(actions)[-2:] == [
        "send bcp_approval_request to system:approval",
        "reply held_for_approval",
    ]
    delivered = decide(shell, approval_of(actions), "approve")
    delivery = sent(delivered, "bcp_response_delivery")
    assert delivery["subscription_id"] == "digest" and delivery["untrusted"]
    assert delivery["provenance"] == {
        "channel": TOPIC,
        "reader": "researcher",
        "subscription_id": "digest",
    }
    clock.now += 3600
    rejected = decide(shell, approval_of(push(shell, "digest", {"summary": "More."})), "reject")
    verdict = sent(rejected, "bcp_validation_result")
    assert verdict.error == "approval_rejected" and verdict.subscription_id == "digest"


# The outbox for an offline controller


def test_pushes_to_an_offline_controller_are_held_in_order_and_flushed_when_it_joins(tmp_path):
    """The first push is held after its send fails, the next without trying; both land in order."""
    core, shell, _ = pushing(tmp_path, "agent:main")
    first = push(shell, "alerts", {"urgent": True})
    assert show(first)[5:] == [
        "send bcp_response_delivery to agent:main",
        "record bcp_held held",
        "commit",
        "set held",
        "commit",
        "send bcp_validation_result to agent:researcher",
        "reply held",
    ]
    assert "held until agent:main" in sent(first, "bcp_validation_result").detail
    second = push(shell, "hourly", {"level": 1})
    assert "send bcp_response_delivery to agent:main" not in show(second)
    assert show(shell.handle(PeerJoined("agent:main", "system:bus")))[:2] == [
        "send bcp_response_delivery to agent:main",
        "reply ok",
    ]
    shell.offline.clear()
    actions = shell.handle(PeerJoined("agent:main", "system:bus"))
    assert show(actions) == [
        "send bcp_response_delivery to agent:main",
        "cancel held",
        "record bcp_delivered delivered",
        "commit",
        "send bcp_response_delivery to agent:main",
        "cancel held",
        "record bcp_delivered delivered",
        "commit",
        "reply ok",
    ]
    assert [a.content["subscription_id"] for a in actions if isinstance(a, Send)] == [
        "alerts",
        "hourly",
    ]
    assert core.ctx.outbox["main"] == []


def test_a_held_push_that_expires_tells_its_reader(tmp_path):
    """The held timer logs bcp_expired and tells the reader controller_unavailable, once."""
    core, shell, _ = pushing(tmp_path, "agent:main")
    push(shell, "alerts", {"urgent": True})
    [held] = core.ctx.outbox["main"]
    key = ("held", "main", held.hold_id)
    actions = shell.handle(TimerFired(key))
    assert show(actions) == [
        "record bcp_expired controller_unavailable",
        "commit",
        "send bcp_validation_result to agent:researcher",
    ]
    assert shell.handle(TimerFired(key)) == []


def test_a_held_failure_expires_silently_and_a_held_item_off_every_channel_is_dropped(tmp_path):
    """An expired bcp_query_failed tells no reader; a restored item for no channel leaves no row."""
    core, shell, clock = make(tmp_path, "agent:researcher", "agent:main")
    ask(shell)
    [held] = core.ctx.outbox["main"]
    assert show(shell.handle(TimerFired(("held", "main", held.hold_id)))) == [
        "record bcp_expired controller_unavailable",
        "commit",
    ]
    stray = Held("hold-1", "main", {"type": "x", "content": {}}, clock.now - 5, "nobody")
    assert core.adopt(GatewayState(held=[stray])) == [SetTimer(("held", "main", "hold-1"), 0.0)]
    assert shell.handle(TimerFired(("held", "main", "hold-1"))) == []


def test_a_flush_skips_what_expired_while_it_was_being_sent(tmp_path):
    """An item that expired during its send is not logged as delivered; the flush goes on."""
    core, shell, _ = pushing(tmp_path, "agent:main")
    push(shell, "alerts", {"urgent": True})
    push(shell, "hourly", {"level": 1})
    first, _second = core.ctx.outbox["main"]
    [spawn, _reply] = core.handle(PeerJoined("agent:main", "system:bus"))
    [send] = spawn.actions
    shell.handle(TimerFired(("held", "main", first.hold_id)))
    after = core.handle(Sent(send.token, 1))
    assert show(after) == ["send bcp_response_delivery to agent:main"]


# Presence, start, settle after restart


def test_presence_announces_subscriptions_and_resends_open_approvals(tmp_path):
    """A reader joining hears its subscriptions; an approver joining gets open approvals."""
    _, shell, _ = pushing(tmp_path)
    actions = shell.handle(PeerJoined("agent:researcher", "system:bus"))
    active = sent(actions, "bcp_subscriptions_active")
    assert [s.subscription_id for s in active.subscriptions] == ["alerts", "hourly", "digest"]
    approval_id = approval_of(push(shell, "digest", {"summary": "News."}))
    actions = shell.handle(PeerJoined("human:carol", "system:bus"))
    assert show(actions) == ["send bcp_approval_request to human:carol", "reply ok"]
    assert actions[0].content["approval_id"] == approval_id


def test_presence_from_anyone_but_the_bus_and_other_messages_are_ignored(tmp_path):
    """A forged peer_joined or peer_left is refused; peer_left from the bus only forgets the
    peer's roles (sends nothing); unknown types change nothing."""
    _, shell, _ = make(tmp_path)
    assert shell.handle(PeerJoined("agent:main", "agent:main"))[0].status == "ignored"
    assert shell.handle(PeerLeft("agent:main", "agent:main"))[0].status == "ignored"
    assert shell.handle(PeerLeft("agent:main", "system:bus")) == [Respond(True)]
    other = MessageReceived("m6", "agent:main", TOPIC, "chat", {})
    assert shell.handle(other) == [Respond(True, "ignored")]


def test_start_announces_to_every_reader_and_flushes_restored_outboxes(tmp_path):
    """On start each reader hears its subscriptions and held deliveries go out."""
    core, shell, clock = pushing(tmp_path)
    item = {"type": "bcp_query_failed", "content": {"query_id": "q1"}}
    held = Held("hold-1", "main", item, clock.now + 60, "researcher")
    stray = Held("hold-2", "main", item, clock.now + 60, "nobody")
    core.adopt(GatewayState(held=[held, stray]))
    assert show(shell.run(core.start())) == [
        "send bcp_subscriptions_active to agent:researcher",
        "send bcp_query_failed to agent:main",
        "cancel held",
        "record bcp_delivered delivered",
        "commit",
        "send bcp_query_failed to agent:main",
        "cancel held",
    ]


def test_settle_expires_orphaned_approvals_and_fails_orphaned_queries(tmp_path):
    """What was in flight at the last stop ends: approvals expired, queries failed with timeout."""
    core, shell, _ = make(tmp_path)
    orphans = Orphans(
        queries=[("main", "researcher", "q7")], approvals=[("main", "researcher", "ap-1")]
    )
    assert show(shell.run(core.settle(orphans))) == [
        "record bcp_approval_decided expired",
        "cancel query",
        "record bcp_query_failed timeout",
        "commit",
        "send bcp_query_failed to agent:main",
        "commit",
    ]
    assert core.state.decided.get("ap-1").note == "the gateway restarted"


def test_settle_gives_back_an_orphaned_querys_reserve_beyond_a_failure(tmp_path):
    """A query the restart ended keeps only what a failure costs of the reserve it had taken:
    a Cat-3 reserve is most of a budget, and a restart must not spend it."""
    core, shell, _ = make(tmp_path)
    core.state.ledger.charge(KEY, 440.0)
    orphans = Orphans(queries=[("main", "researcher", "q7")], charged={("main", "q7"): 440.0})
    assert show(shell.run(core.settle(orphans)))[-2:] == [
        "record bcp_bits_charged charged",
        "commit",
    ]
    assert core.state.ledger.used(KEY) == pytest.approx(FAILED)


# Anomalies


@pytest.mark.parametrize("action", ["flag", "review"])
def test_anomalies_reach_the_controller_on_flag_and_the_human_on_review(tmp_path, action):
    """flag delivers the anomalies with the answer; review lists them in the approval request."""
    _, shell, _ = make(tmp_path, anomaly=action)
    ask(shell, spec=CAT2)
    actions = answer(shell, FLAGGED)
    if action == "flag":
        assert sent(actions, "bcp_response_delivery")["anomalies"]
    else:
        assert sent(actions, "bcp_approval_request").anomalies


@pytest.mark.parametrize("spec", [CAT1, CAT2, CAT3], ids=["cat1", "cat2", "cat3"])
def test_the_question_frame_is_what_its_model_would_validate(spec):
    """bcp_query, put together from parts validated already, sends exactly what validating
    the same parts through BcpQuery would send, and validates as one."""
    bare = QuerySpec.model_validate(spec)
    at = 1_790_000_000.75
    built = wire(question(bare, "q-1", "main", at))
    fields = {"query_id": "q-1", "controller": "main", **spec, "expires_at": iso(at)}
    assert built == wire(BcpQuery.model_validate(fields))
    assert wire(BcpQuery.model_validate(built)) == built


# The release grid (delivery_quantum)


def test_an_answer_leaves_at_its_grid_point_charged_its_slot(tmp_path):
    """An answer given 0.7 steps after the reader was asked waits for the first grid point,
    and pays what it carries, one bit, and slot 0."""
    core, shell, clock = make(tmp_path, quantum=0.1)
    ask(shell)
    reserved = core.state.ledger.used(KEY)
    clock.now += 0.07
    actions = answer(shell, {"has_pricing": True, "tier": "pro", "rating": 4, "region": "eu"})
    assert "send bcp_response_delivery to agent:main" not in show(actions)
    # The reserve stays until the delivery leaves: admission cannot show when the reader answered.
    assert core.state.ledger.used(KEY) == reserved
    assert "record bcp_bits_charged charged" not in show(actions)
    [timer] = [a for a in actions if isinstance(a, SetTimer) and a.key[0] == "release"]
    assert timer.delay == pytest.approx(0.03, abs=1e-5)
    clock.now += timer.delay
    released = shell.handle(TimerFired(timer.key))
    delivery = sent(released, DELIVERY)
    assert delivery["bits"] == {
        "value": pytest.approx(CAT1_BITS, abs=1e-3),
        "outcome": 1.0,
        "timing": 2.0,
    }
    assert core.state.ledger.used(KEY) == pytest.approx(CAT1_BITS + 1 + 2, abs=1e-3)


def test_a_late_answer_pays_for_its_slot_and_releases_in_order(tmp_path):
    """Two answers due at one grid point leave in the order they were given; a later slot costs
    more, never more than what was reserved."""
    core, shell, clock = make(tmp_path, quantum=0.1)
    ask(shell, "q1")
    ask(shell, "q2")
    reserved = core.state.ledger.used(KEY)
    clock.now += 0.35  # slot 3: 1 + gamma(4) = 6 bits
    good = {"has_pricing": True, "tier": "pro", "rating": 4, "region": "eu"}
    timers = [
        a
        for query_id in ("q1", "q2")
        for a in answer(shell, good, query_id)
        if isinstance(a, SetTimer) and a.key[0] == "release"
    ]
    assert [t.delay for t in timers] == [pytest.approx(0.05, abs=1e-5)] * 2
    clock.now += 0.05
    released = shell.handle(TimerFired(timers[1].key))
    ids = [a.content["query_id"] for a in released if isinstance(a, Send) and a.type == DELIVERY]
    assert ids == ["q1", "q2"]
    assert shell.handle(TimerFired(timers[0].key)) == []
    used = core.state.ledger.used(KEY)
    assert used == pytest.approx(2 * (CAT1_BITS + 1 + 6), abs=1e-3) and used < reserved


def test_a_grid_points_deliveries_leave_side_by_side(tmp_path):
    """Two answers due at one grid point are released as one background run each, in order,
    so the second's send does not wait for the first's answer and row."""
    core, shell, clock = make(tmp_path, quantum=0.1)
    ask(shell, "q1")
    ask(shell, "q2")
    clock.now += 0.05
    good = {"has_pricing": True, "tier": "pro", "rating": 4, "region": "eu"}
    timers = [
        a
        for query_id in ("q1", "q2")
        for a in answer(shell, good, query_id)
        if isinstance(a, SetTimer) and a.key[0] == "release"
    ]
    clock.now += 0.05
    released = core.handle(TimerFired(timers[0].key))
    runs = [a.actions for a in released if isinstance(a, Spawn)]
    sends = [[a for a in run if isinstance(a, Send)] for run in runs]
    assert [[s.content["query_id"] for s in run] for run in sends] == [["q1"], ["q2"]]
    assert all(s.token is not None for run in sends for s in run)


def test_a_failure_leaves_on_the_grid_and_says_what_it_cost(tmp_path):
    """retries_exhausted waits for its grid point and carries its bits: outcome and slot."""
    core, shell, clock = make(tmp_path, quantum=0.1)
    ask(shell)
    actions = []
    for _ in range(SETTINGS.max_retries + 1):
        actions = answer(shell, {"nonsense": 1})
    [timer] = [a for a in actions if isinstance(a, SetTimer) and a.key[0] == "release"]
    clock.now += timer.delay
    failed = sent(shell.handle(TimerFired(timer.key)), "bcp_query_failed")
    assert failed["error"] == "retries_exhausted"
    assert failed["bits"] == {
        "value": 0.0,
        "outcome": pytest.approx(FAILED, abs=1e-3),
        "timing": 2.0,
    }
    assert core.state.ledger.used(KEY) == pytest.approx(FAILED + 2, abs=1e-3)


def _first_release(actions: list[Any]) -> SetTimer:
    [timer] = [a for a in actions if isinstance(a, SetTimer) and a.key[0] == "release"]
    return timer


def test_a_push_is_charged_as_it_leaves_and_the_next_grid_starts_at_its_grid_point(tmp_path):
    """A push changes the budget only when it leaves on the grid, and the next push's grid is
    laid from that grid point: when within its slot the reader pushed shows nowhere."""
    releases = []
    for phase in (0.01, 0.09):
        (tmp_path / str(phase)).mkdir()
        core, shell, clock = make(tmp_path / str(phase), subscriptions=SUBSCRIPTIONS, quantum=0.1)
        start = clock.now
        clock.now += phase
        actions = push(shell, "hourly", {"level": 1})
        assert "record bcp_bits_charged charged" not in show(actions)
        assert core.state.ledger.used(KEY) == 0
        timer = _first_release(actions)
        clock.now += timer.delay
        assert "record bcp_bits_charged charged" in show(shell.handle(TimerFired(timer.key)))
        assert core.state.ledger.used(KEY) == pytest.approx(3 + 1 + 2)  # value, came, slot 0
        clock.now = start + 0.1 + 10 + 0.05  # the next push, at one moment in both runs
        timer = _first_release(push(shell, "hourly", {"level": 2}))
        releases.append(clock.now + timer.delay - start)
    assert releases[0] == pytest.approx(releases[1]) == pytest.approx(10.2)


def test_a_push_whose_budget_a_query_took_meanwhile_does_not_leave(tmp_path):
    """A query admitted while a push waits for its grid point may take the budget it needs:
    the push is then refused budget_exhausted as it would leave, and never reaches the
    controller; the reader is told."""
    core, shell, clock = make(tmp_path, subscriptions=SUBSCRIPTIONS, quantum=0.1, budget=24)
    clock.now += 0.03
    timer = _first_release(push(shell, "hourly", {"level": 1}))
    assert show(ask(shell))[-2:] == ["reply accepted", "send bcp_query to agent:researcher"]
    assert core.state.ledger.left(KEY, 24) < 6  # what the push carries no longer fits
    clock.now += timer.delay
    actions = shell.handle(TimerFired(timer.key))
    assert "send bcp_response_delivery to agent:main" not in show(actions)
    assert "record bcp_push_refused budget_exhausted" in show(actions)
    assert sent(actions, "bcp_validation_result").error == "budget_exhausted"


def test_a_cat2_answer_is_charged_what_it_carries_not_its_estimate(tmp_path):
    """The reserve is the ceiling; a short answer pays its measure and the rest comes back."""
    core, shell, _ = make(tmp_path)
    ask(shell, spec=CAT2)
    reserved = core.state.ledger.used(KEY)
    actions = answer(shell, {"company": "Acme Corp", "founded": "1998-04-01"})
    delivery = sent(actions, DELIVERY)
    assert delivery["bandwidth_bits"] == delivery["bits"]["value"] < 11 * 5 + 44 + 21.8
    assert core.state.ledger.used(KEY) == pytest.approx(delivery["bandwidth_bits"] + 1, abs=1e-3)
    assert reserved > core.state.ledger.used(KEY)
