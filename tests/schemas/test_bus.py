"""The presence models of schemas.bus: what the bus publishes on system:presence."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from hypothesis import given, strategies as st
from pydantic import ValidationError

from schemas import generate
from schemas.bus import (
    PRESENCE_MODELS,
    PeerJoined,
    PeerLeft,
    PingResult,
    PresenceType,
    SendMessageResult,
)
from schemas.common import timestamp


def test_every_presence_type_has_a_content_model_and_a_schema_file():
    """PRESENCE_MODELS maps each presence type to its model, generated as <type>.json."""
    assert set(PRESENCE_MODELS) == set(typing.get_args(PresenceType))
    for name, model in PRESENCE_MODELS.items():
        assert generate.MODELS[name] is model
        schema = model.model_json_schema(by_alias=True)
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        assert "clientId" in schema["required"]


def test_peer_joined_round_trips_the_wire_shape():
    """peer_joined reads and writes clientId (camelCase) and the sorted roles."""
    wire = {"clientId": "agent:researcher", "roles": ["agent", "reader"]}
    joined = PeerJoined.model_validate(wire)
    assert joined.client_id == "agent:researcher"
    assert joined.model_dump(mode="json", by_alias=True) == wire
    assert PeerJoined(client_id="tg:-100123", roles=[]).roles == []


@pytest.mark.parametrize(
    "content",
    [
        {"clientId": "agent:w1", "roles": ["reader", "agent"]},  # not sorted
        {"clientId": "agent:w1", "roles": ["agent", "agent"]},  # not unique
        {"clientId": "agent:w1", "roles": ["Agent"]},  # not a role name
        {"clientId": "agent:w1", "roles": ("agent",)},  # strict: a tuple is not a JSON array
        {"clientId": "agent:w1"},
        {"clientId": "nobody", "roles": []},
        {"clientId": "agent:w1", "roles": [], "taint": "high"},
    ],
)
def test_peer_joined_refuses_what_the_bus_never_sends(content: dict[str, Any]):
    """Unsorted or repeated roles, bad names, a bad clientId and extra keys are refused."""
    with pytest.raises(ValidationError):
        PeerJoined.model_validate(content)


@pytest.mark.parametrize("reason", ["disconnected", "replaced"])
def test_peer_left_takes_both_reasons(reason: str):
    """peer_left reads clientId and a reason of disconnected or replaced."""
    left = PeerLeft.model_validate({"clientId": "agent:w1", "reason": reason})
    assert left.model_dump(mode="json", by_alias=True) == {"clientId": "agent:w1", "reason": reason}


@pytest.mark.parametrize(
    "content",
    [
        {"clientId": "agent:w1", "reason": "crashed"},
        {"clientId": "agent:w1"},
        {"clientId": "agent:w1", "reason": "replaced", "by": "agent:w1"},
    ],
)
def test_peer_left_refuses_other_reasons_and_extra_keys(content: dict[str, Any]):
    """A reason other than the two, a missing reason or an extra key is refused."""
    with pytest.raises(ValidationError):
        PeerLeft.model_validate(content)


def test_presence_events_are_frozen():
    """A presence event cannot be changed once built."""
    left = PeerLeft(client_id="agent:w1", reason="replaced")
    with pytest.raises(ValidationError):
        left.reason = "disconnected"  # type: ignore[misc]


@given(
    message_id=st.text(min_size=1, max_size=40),
    delivered=st.integers(min_value=0, max_value=10_000),
    epoch=st.integers(min_value=0, max_value=2**53),
)
def test_send_message_frame_is_the_models_wire_form(message_id: str, delivered: int, epoch: int):
    """The bus answers sendMessage with ``SendMessageResult.frame``: it must be exactly what the
    validated model dumps, so the hot path's shortcut never drifts from the schema."""
    frame = SendMessageResult.frame(message_id, delivered, epoch)
    model = SendMessageResult.model_validate(frame)
    assert model.model_dump(by_alias=True) == frame


def test_ping_frame_is_the_models_wire_form():
    """``PingResult.frame`` validates as the model and keeps the wire's time format."""
    now = timestamp()
    frame = PingResult.frame(now)
    model = PingResult.model_validate(frame)
    assert model.pong is True
    assert timestamp(model.server_time) == now
    assert set(frame) == set(model.model_dump(by_alias=True))
