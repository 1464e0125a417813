"""The content models of the chat and agent types (schemas/chat.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.chat import (
    CONTENT_MODELS,
    MAX_TEXT,
    AgentLifecycle,
    Configure,
    RouteAssigned,
    SpawnError,
    SpawnRequest,
    SpawnResult,
    TgMessage,
    TgReply,
)


def test_every_type_of_the_bootstrap_flow_has_a_model():
    """Each chat type the default policy names has its content model."""
    assert set(CONTENT_MODELS) == {
        "spawn_request",
        "spawn_result",
        "route_assigned",
        "configure",
        "tg_message",
        "tg_reply",
        "scheduled_message",
    }


def test_a_spawn_result_is_a_success_with_a_status_or_a_failure_with_an_error():
    """success and status go together, as do failure and error; a mix is refused."""
    assert SpawnResult(agent="echo", success=True, status="started").error is None
    failed = SpawnResult(agent="echo", success=False, error=SpawnError.NO_TOKEN, detail="ask")
    assert failed.model_dump(mode="json", exclude_none=True) == {
        "agent": "echo",
        "success": False,
        "error": "no_token",
        "detail": "ask",
    }
    for content in (
        {"agent": "echo", "success": True},
        {"agent": "echo", "success": True, "status": "started", "error": "no_token"},
        {"agent": "echo", "success": False},
        {"agent": "echo", "success": False, "error": "no_token", "status": "running"},
        {"agent": "echo", "success": "yes", "status": "started"},
    ):
        with pytest.raises(ValidationError):
            SpawnResult.model_validate(content)


@pytest.mark.parametrize(
    ("model", "content"),
    [
        (SpawnRequest, {"agent": "bad name"}),
        (SpawnRequest, {"agent": "echo", "extra": 1}),
        (RouteAssigned, {"chat": "tg:1", "agent": "nobody"}),
        (Configure, {"talkto": "tg:*"}),
        (TgMessage, {"text": ""}),
        (TgMessage, {"text": "x" * (MAX_TEXT + 1)}),
        (TgMessage, {"text": "hi", "id": "has space"}),
        (TgReply, {"text": "hi", "in_reply_to": 7}),
        (AgentLifecycle, {"event": "crashed", "agent": "echo", "pid": 1}),
    ],
)
def test_malformed_content_is_refused(model, content):
    """Bad names, clientIds, ids, empty or oversized text and unknown keys are refused."""
    with pytest.raises(ValidationError):
        model.model_validate(content)


def test_a_message_may_omit_its_id_and_a_reply_its_reference():
    """`id` and `in_reply_to` are optional: a message without one is simply not retried."""
    assert TgMessage(text="hello").id is None
    assert TgReply(text="hi").in_reply_to is None
