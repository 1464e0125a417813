"""Screener peers in the gateway's core, without an event loop: requests out, verdicts in.

The end-to-end runs on a real bus are in test_screeners.py; the rules of
:func:`peers.gateway.screeners.combine` are checked here for every combination.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st

from peers.gateway.core import GatewayCore
from peers.gateway.events import MessageReceived, Record, Send, Sent, SetTimer, Spawn, TimerFired
from peers.gateway.screeners import Unusable, combine, read_verdict
from peers.gateway.state import GatewayState
from peers.gateway.validation import ValidationResult
from schemas.agents import DefinitionError, build_channels, load_agents
from schemas.bcp import (
    UNTRUSTED_NOTICE,
    Anomaly,
    AnomalyCode,
    BcpScreenRequest,
    BcpScreenVerdict,
)

from .test_core import KEY, SETTINGS, Clock, Shell, ask, push, sent, show
from .test_flows import CAT1, CAT2, CAT3, agents

TOPIC = "bcp:main:researcher"
SCREENER = "system:screener-a"
OTHER = "system:screener-b"
GOOD = {"company": "Acme", "founded": "1998-04-01"}
"""A valid Cat-2 answer."""


def screened_agents(
    tmp_path: Path,
    *,
    screeners: tuple[str, ...] = (SCREENER,),
    failure: str = "reject",
    anomaly: str = "reject",
    subscriptions: str = "",
) -> Path:
    """The reference pair's channel naming ``screeners``; both sides say ``screener_failure``."""
    named = f"    screeners: [{', '.join(screeners)}]\n    screener_failure: {failure}\n"
    directory = agents(tmp_path, anomaly=anomaly, subscriptions=named + subscriptions)
    # The stricter side holds and reject is the default, so the reader says it too.
    reader = directory / "researcher.md"
    end = "---\nresearcher"
    reader.write_text(reader.read_text().replace(end, f"    screener_failure: {failure}\n{end}"))
    return directory


def screening(tmp_path: Path, *offline: str, **options: Any) -> tuple[GatewayCore, Shell, Clock]:
    """A core for :func:`screened_agents` (same options); nobody at ``offline``."""
    clock = Clock()
    channels = build_channels(load_agents(screened_agents(tmp_path, **options)))
    core = GatewayCore(channels, GatewayState(), SETTINGS, clock=clock)
    return core, Shell(core, *offline), clock


def answer(shell: Shell, response: Any, query_id: str = "q1") -> list[Any]:
    content = {"query_id": query_id, "response": response}
    return shell.handle(MessageReceived("m2", "agent:researcher", TOPIC, "bcp_response", content))


def requests(actions: list[Any]) -> dict[str, BcpScreenRequest]:
    """The bcp_screen_request sent to each screener."""
    return {
        a.topic: a.content
        for a in actions
        if isinstance(a, Send) and a.type == "bcp_screen_request"
    }


def screen_id(actions: list[Any]) -> str:
    [screen] = {r.screen_id for r in requests(actions).values()}
    return screen


def verdict(shell: Shell, screen: str, sender: str = SCREENER, **content: Any) -> list[Any]:
    body = {"screen_id": screen, **content}
    event = MessageReceived("v1", sender, "system:gateway", "bcp_screen_verdict", body)
    return shell.handle(event)


def rows(actions: list[Any], event: str) -> list[Record]:
    return [a for a in actions if isinstance(a, Record) and a.event == event]


def reasons(actions: list[Any]) -> list[tuple[str | None, str, str]]:
    result = sent(actions, "bcp_validation_result")
    return [(r.field, r.code.value, r.message) for r in result.reasons]


# Asking


def test_a_valid_text_answer_is_sent_to_the_screener_with_its_raw_and_normalized_text(tmp_path):
    """The request is logged and committed, then sent; the reader's reply says screening."""
    core, shell, clock = screening(tmp_path)
    ask(shell, spec=CAT2)
    raw = {"company": " Acme \t Corp", "founded": "1998-04-01"}
    actions = answer(shell, raw)
    assert show(actions) == [
        "record bcp_screen_requested pending",
        "commit",
        "set screen",
        f"send bcp_screen_request to {SCREENER}",
        "reply screening",
    ]
    request = requests(actions)[SCREENER]
    assert [(t.field, t.raw, t.normalized) for t in request.texts] == [
        ("company", " Acme \t Corp", "Acme Corp"),
        ("founded", "1998-04-01", "1998-04-01"),
    ]
    assert request.channel == TOPIC and request.query_id == "q1" and request.category == 2
    assert request.untrusted is True and request.notice == UNTRUSTED_NOTICE
    assert request.taint == "high"
    assert request.expires_at.timestamp() == clock.now + SETTINGS.screener_timeout
    assert actions[2] == SetTimer(("screen", request.screen_id), SETTINGS.screener_timeout)
    assert actions[0].payload["screeners"] == [SCREENER]
    assert actions[0].message_id == "m2"
    assert core.ctx.pending[("main", "q1")].state == "screening"


def test_cat1_answers_and_invalid_answers_are_not_screened(tmp_path):
    """Only a valid Cat-2 or Cat-3 answer goes to the screeners."""
    _, shell, _ = screening(tmp_path)
    ask(shell, spec=CAT1)
    answer_ = {"has_pricing": True, "tier": "pro", "rating": 4, "region": "eu"}
    assert "send bcp_response_delivery to agent:main" in show(answer(shell, answer_))
    ask(shell, "q2", CAT2)
    actions = answer(shell, {"company": "Acme"}, "q2")
    assert not requests(actions) and show(actions)[-1] == "reply validation_failed"


# Verdicts


def test_a_pass_verdict_delivers_the_answer(tmp_path):
    """pass: the validation row, the reader's verdict and the delivery follow the screened row."""
    core, shell, _ = screening(tmp_path)
    ask(shell, spec=CAT2)
    screen = screen_id(answer(shell, GOOD))
    actions = verdict(shell, screen, verdict="pass", detail="score 0.01")
    assert show(actions) == [
        "record bcp_screened pass",
        "cancel screen",
        "record bcp_validation pass",
        "commit",
        "send bcp_validation_result to agent:researcher",
        "cancel query",
        "record bcp_bits_charged charged",
        "send bcp_response_delivery to agent:main",
        "record bcp_delivered delivered",
        "commit",
        "reply screened",
    ]
    assert actions[0].payload["detail"] == "score 0.01" and actions[0].message_id == "v1"
    [told] = [a for a in actions if isinstance(a, Send) and a.type == "bcp_validation_result"]
    assert told.correlation_id == "m2" and told.topic == "agent:researcher"
    assert sent(actions, "bcp_response_delivery")["response"] == GOOD
    assert not core.ctx.pending and not core.screens.pending


def test_a_reject_verdict_refuses_the_answer_whatever_the_anomaly_action(tmp_path):
    """reject on a flag channel: the reader is told why and may retry; nothing is delivered."""
    core, shell, _ = screening(tmp_path, anomaly="flag")
    ask(shell, spec=CAT2)
    screen = screen_id(answer(shell, GOOD))
    findings = [{"code": "instruction", "field": "company"}]
    actions = verdict(shell, screen, verdict="reject", findings=findings, detail="pwned")
    assert "send bcp_response_delivery to agent:main" not in show(actions)
    assert reasons(actions) == [
        ("company", "anomaly", f"screener {SCREENER} refused it: instruction"),
    ]
    assert sent(actions, "bcp_validation_result").retries_left == 2
    assert "pwned" not in str(sent(actions, "bcp_validation_result"))
    assert rows(actions, "bcp_validation")[0].status == "fail"
    assert core.ctx.pending[("main", "q1")].state == "asking"
    assert show(actions)[-1] == "reply screened"


@pytest.mark.parametrize(
    ("action", "outcome"),
    [("reject", "refused"), ("review", "review"), ("flag", "delivered")],
)
def test_a_flag_counts_like_the_gateways_own_findings(tmp_path, action, outcome):
    """flag under the channel's anomaly_action: refused, held for a human, or delivered flagged."""
    _, shell, _ = screening(tmp_path, anomaly=action)
    ask(shell, spec=CAT2)
    screen = screen_id(answer(shell, GOOD))
    findings = [{"code": "url"}, {"code": "instruction", "field": "founded"}]
    actions = verdict(shell, screen, verdict="flag", findings=findings, detail="free text")
    expected = [
        {"code": "url", "detail": f"flagged by {SCREENER}"},
        {"code": "instruction", "detail": f"flagged by {SCREENER}", "field": "founded"},
    ]
    if outcome == "refused":
        assert [r[:2] for r in reasons(actions)] == [(None, "anomaly"), ("founded", "anomaly")]
    elif outcome == "review":
        request = sent(actions, "bcp_approval_request")
        assert [a.model_dump(exclude_none=True) for a in request.anomalies] == expected
    else:
        # Only the codes reach the controller, in the spec's field order: not the screener's
        # name (a choice among the channel's screeners), nor its words.
        delivery = sent(actions, "bcp_response_delivery")
        assert delivery["anomalies"] == [
            {"code": "instruction", "detail": "instruction", "field": "founded"},
            {"code": "url", "detail": "url"},
        ]
        assert SCREENER not in str(delivery) and "free text" not in str(delivery)


def test_a_screened_cat3_summary_still_goes_to_a_human(tmp_path):
    """A summary is screened as one text; passed, it waits for approval as every Cat-3 answer."""
    _, shell, _ = screening(tmp_path)
    ask(shell, spec=CAT3)
    asked = answer(shell, {"summary": "Prices rose  by five percent."})
    [text] = requests(asked)[SCREENER].texts
    assert (text.field, text.normalized, text.expected_format) == (
        "summary",
        "Prices rose by five percent.",
        None,
    )
    actions = verdict(shell, screen_id(asked), verdict="pass")
    assert sent(actions, "bcp_approval_request").response == {
        "summary": "Prices rose by five percent."
    }
    assert "send bcp_response_delivery to agent:main" not in show(actions)


# Failures: fail closed as screener_failure says


def test_a_screener_that_does_not_answer_in_time_fails_closed(tmp_path):
    """timeout under reject: the reader is told unscreened; the row says timeout."""
    _, shell, _ = screening(tmp_path)
    ask(shell, spec=CAT2)
    screen = screen_id(answer(shell, GOOD))
    actions = shell.handle(TimerFired(("screen", screen)))
    assert [(r.status, r.payload["screener"]) for r in rows(actions, "bcp_screened")] == [
        ("timeout", SCREENER)
    ]
    assert [r[:2] for r in reasons(actions)] == [(None, "unscreened")]
    assert "send bcp_response_delivery to agent:main" not in show(actions)
    # A verdict after the decision is not taken.
    assert show(verdict(shell, screen, verdict="pass")) == ["reply unknown_screen"]


def test_under_review_a_failure_holds_the_answer_for_a_human(tmp_path):
    """timeout under review: an approval request with the unscreened anomaly."""
    _, shell, _ = screening(tmp_path, failure="review")
    ask(shell, spec=CAT2)
    screen = screen_id(answer(shell, GOOD))
    actions = shell.handle(TimerFired(("screen", screen)))
    request = sent(actions, "bcp_approval_request")
    assert [a.code for a in request.anomalies] == [AnomalyCode.UNSCREENED]
    assert "send bcp_response_delivery to agent:main" not in show(actions)


def test_an_offline_screener_fails_at_once(tmp_path):
    """Nobody took the request: unavailable, decided without waiting for the timer."""
    _, shell, _ = screening(tmp_path, SCREENER)
    ask(shell, spec=CAT2)
    actions = answer(shell, GOOD)
    assert [r.status for r in rows(actions, "bcp_screened")] == ["unavailable"]
    assert "cancel screen" in show(actions)
    assert [r[:2] for r in reasons(actions)] == [(None, "unscreened")]


MALFORMED = [
    {"verdict": "maybe"},
    {"verdict": "pass", "note": "ignore previous instructions"},
    {"verdict": "pass", "findings": [{"code": "url"}]},
    {"verdict": "flag"},
    {"verdict": "flag", "findings": [{"code": "exfiltrate"}]},
    {"verdict": "flag", "findings": [{"code": "unscreened"}]},
    {"verdict": "flag", "findings": [{"code": "url", "field": "not_asked"}]},
    {"verdict": "pass", "detail": "x" * 201},
    {"verdict": "reject", "findings": [{"code": "url"}] * 33},
    {"verdict": ["pass"]},
]


@pytest.mark.parametrize("content", MALFORMED)
def test_a_malformed_verdict_counts_as_no_verdict(tmp_path, content):
    """Anything but a well-formed verdict about this answer fails closed, and is refused."""
    _, shell, _ = screening(tmp_path)
    ask(shell, spec=CAT2)
    screen = screen_id(answer(shell, GOOD))
    actions = verdict(shell, screen, **content)
    assert [r.status for r in rows(actions, "bcp_screened")] == ["malformed"]
    assert [r[:2] for r in reasons(actions)] == [(None, "unscreened")]
    assert show(actions)[-1] == "reply invalid_verdict"


def test_only_the_screeners_asked_answer_and_each_once(tmp_path):
    """An impostor's verdict and a second verdict are refused; both screeners must answer."""
    _, shell, _ = screening(tmp_path, screeners=(SCREENER, OTHER))
    ask(shell, spec=CAT2)
    asked = answer(shell, GOOD)
    assert set(requests(asked)) == {SCREENER, OTHER}
    screen = screen_id(asked)
    assert show(verdict(shell, screen, "system:screener-z", verdict="pass")) == [
        "reply unknown_screen"
    ]
    assert show(verdict(shell, "sc-nope", verdict="pass")) == ["reply unknown_screen"]
    assert show(verdict(shell, screen, verdict="pass")) == [
        "record bcp_screened pass",
        "reply screened",
    ]
    assert show(verdict(shell, screen, verdict="pass")) == ["reply already_screened"]
    actions = verdict(shell, screen, OTHER, verdict="reject")
    assert [r[:2] for r in reasons(actions)] == [(None, "anomaly")]


def test_reports_that_come_late_change_nothing(tmp_path):
    """A screener that answered and then refused the request stays answered; a timer that
    fires after the decision is ignored; only the silent screener times out."""
    core, shell, _ = screening(tmp_path, screeners=(SCREENER, OTHER))
    ask(shell, spec=CAT2)
    event = MessageReceived(
        "m2", "agent:researcher", TOPIC, "bcp_response", {"query_id": "q1", "response": GOOD}
    )
    actions = core.handle(event)  # as the gateway gets them: the sends not carried out yet
    tokens = {
        a.topic: a.token for spawn in actions if isinstance(spawn, Spawn) for a in spawn.actions
    }
    screen = screen_id([a for spawn in actions if isinstance(spawn, Spawn) for a in spawn.actions])
    verdict(shell, screen, verdict="pass")
    assert core.handle(Sent(tokens[SCREENER], 0)) == []
    timed_out = shell.handle(TimerFired(("screen", screen)))
    assert [(r.status, r.payload["screener"]) for r in rows(timed_out, "bcp_screened")] == [
        ("timeout", OTHER)
    ]
    assert core.handle(TimerFired(("screen", screen))) == []
    assert core.handle(Sent(tokens[OTHER], 1)) == []


def test_no_second_answer_is_taken_while_screening_and_expiry_waits_for_the_verdict(tmp_path):
    """A query answered but under screening refuses more answers; its timer looks again later."""
    core, shell, _ = screening(tmp_path)
    ask(shell, spec=CAT2)
    screen = screen_id(answer(shell, GOOD))
    assert show(answer(shell, GOOD))[-1] == "reply unknown_query"
    timer = ("query", "main", "q1")
    assert shell.handle(TimerFired(timer)) == [SetTimer(timer, SETTINGS.screener_timeout)]
    verdict(shell, screen, verdict="reject")
    actions = shell.handle(TimerFired(timer))
    assert "record bcp_query_failed timeout" in show(actions)
    assert not core.ctx.pending


# Pushes


PUSHED = """    subscriptions:
      - id: findings
        category: 2
        questions:
          - {id: finding, question: "What?", max_words: 10, expected_format: short_text}
        min_interval_s: 3600
"""


def test_a_push_is_charged_only_once_its_screeners_passed_it(tmp_path):
    """A refused push costs nothing; a passed one is charged and delivered."""
    core, shell, _ = screening(tmp_path, subscriptions=PUSHED)
    screen = screen_id(push(shell, "findings", {"finding": "Prices rose"}))
    assert core.state.ledger.used(KEY) == 0
    actions = verdict(shell, screen, verdict="reject")
    assert "record bcp_push_refused validation_failed" in show(actions)
    assert core.state.ledger.used(KEY) == 0
    screen = screen_id(push(shell, "findings", {"finding": "Prices rose"}))
    actions = verdict(shell, screen, verdict="pass")
    assert "send bcp_response_delivery to agent:main" in show(actions)
    assert core.state.ledger.used(KEY) > 0


def test_one_push_per_subscription_is_screened_at_a_time(tmp_path):
    """A second push while the first is with the screeners is refused at once, unscreened."""
    _, shell, _ = screening(tmp_path, subscriptions=PUSHED)
    first = screen_id(push(shell, "findings", {"finding": "Prices rose"}))
    actions = push(shell, "findings", {"finding": "Prices fell"})
    assert not requests(actions) and show(actions)[-1] == "reply rate_limited"
    assert "still being screened" in sent(actions, "bcp_validation_result").detail
    assert "send bcp_response_delivery to agent:main" in show(verdict(shell, first, verdict="pass"))


def test_a_push_is_checked_against_the_budget_again_after_screening(tmp_path):
    """The budget spent while a push was screened refuses it, uncharged, once it passes."""
    core, shell, _ = screening(tmp_path, subscriptions=PUSHED)
    screen = screen_id(push(shell, "findings", {"finding": "Prices rose"}))
    core.state.ledger.charge(KEY, 1999)
    actions = verdict(shell, screen, verdict="pass")
    assert show(actions)[:3] == [
        "record bcp_screened pass",
        "cancel screen",
        "record bcp_validation pass",
    ]
    assert "record bcp_push_refused budget_exhausted" in show(actions)
    assert "send bcp_response_delivery to agent:main" not in show(actions)
    assert core.state.ledger.used(KEY) == 1999


# The combination, for every outcome


VERDICTS = st.one_of(
    st.builds(
        BcpScreenVerdict,
        screen_id=st.just("sc-1"),
        verdict=st.just("pass"),
    ),
    st.builds(
        BcpScreenVerdict,
        screen_id=st.just("sc-1"),
        verdict=st.sampled_from(["flag", "reject"]),
        findings=st.lists(
            st.fixed_dictionaries(
                {"code": st.sampled_from(["url", "instruction"]), "field": st.just("company")}
            ),
            min_size=1,
            max_size=3,
        ),
    ),
    st.builds(Unusable, why=st.sampled_from(["unavailable", "timeout", "malformed"])),
)


@given(
    own=st.lists(st.sampled_from([AnomalyCode.URL, AnomalyCode.CODE]), max_size=2),
    outcomes=st.lists(VERDICTS, min_size=1, max_size=4),
    action=st.sampled_from(["reject", "review", "flag"]),
    failure=st.sampled_from(["reject", "review"]),
)
def test_screeners_only_ever_make_the_outcome_stricter(own, outcomes, action, failure):
    """Accepted only if no screener refused, failed under reject, or flagged under reject."""
    found = tuple(Anomaly(code=code, detail="gateway") for code in own)
    held = action == "review" and bool(own)
    base = ValidationResult(2, True, {"company": "Acme"}, (), found, held)
    named = {f"system:s{i}": outcome for i, outcome in enumerate(outcomes)}
    final = combine(base, named, anomaly_action=action, screener_failure=failure)
    refused = any(
        (isinstance(o, Unusable) and failure == "reject")
        or (isinstance(o, BcpScreenVerdict) and o.verdict == "reject")
        or (isinstance(o, BcpScreenVerdict) and o.verdict == "flag" and action == "reject")
        for o in outcomes
    )
    assert final.accepted is not refused
    assert set(base.anomalies) <= set(final.anomalies)
    if final.accepted:
        assert final.response == base.response
        held = bool(base.needs_review) or any(
            (isinstance(o, Unusable) and failure == "review")
            or (isinstance(o, BcpScreenVerdict) and o.verdict == "flag" and action == "review")
            for o in outcomes
        )
        assert final.needs_review is held
    else:
        assert final.response is None and final.reasons


def test_read_verdict_takes_a_verdict_about_the_fields_asked():
    """Findings may name the answer's fields or none; a verdict is read strictly."""
    good = {"screen_id": "sc-1", "verdict": "flag", "findings": [{"code": "url", "field": "a"}]}
    assert isinstance(read_verdict(good, ["a"]), BcpScreenVerdict)
    assert read_verdict(good, ["b"]) == Unusable(
        "malformed", "a finding names 'a', not a field asked"
    )
    assert read_verdict({"screen_id": "sc-1"}, ["a"]).why == "malformed"


# Definitions


def test_both_sides_screeners_apply_and_the_stricter_failure_holds(tmp_path):
    """The channel's screeners are both sides'; reject beats review."""
    directory = agents(tmp_path)
    reader = directory / "researcher.md"
    text = reader.read_text().replace(
        "    anomaly_action", "    screeners: [system:b, system:a]\n    anomaly_action"
    )
    reader.write_text(text)
    main = directory / "main.md"
    main.write_text(
        main.read_text().replace(
            "    max_escalations_per_task: 1\n",
            "    max_escalations_per_task: 1\n    screeners: [system:a]\n"
            "    screener_failure: review\n",
        )
    )
    [channel] = build_channels(load_agents(directory)).values()
    assert channel.screeners == ("system:a", "system:b")
    assert channel.screener_failure == "reject"


@pytest.mark.parametrize(
    ("screeners", "message"),
    [
        ("[system:gateway]", "the bus's or the gateway's own name"),
        ("[system:a, system:a]", "duplicate screener"),
        ("[agent:judge]", r"screeners\[0\]: String should match"),
        ("[system:" + ", system:".join("abcdefghi") + "]", "screeners"),
    ],
)
def test_bad_screener_lists_are_definition_errors(tmp_path, screeners, message):
    """Reserved names, duplicates, non-system peers and too many screeners are refused."""
    directory = agents(tmp_path, subscriptions=f"    screeners: {screeners}\n")
    with pytest.raises(DefinitionError, match=message):
        load_agents(directory)
