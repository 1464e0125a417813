"""The bus's fast check of ``sendMessage`` params accepts only what the pydantic models accept."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings, strategies as st
from pydantic import AwareDatetime, TypeAdapter, ValidationError

from bus.core.errors import InvalidParams
from bus.core.params import _fast_send_message, _valid_timestamp, read_send_message
from schemas.bus import SendMessageParams

AWARE: TypeAdapter[AwareDatetime] = TypeAdapter(AwareDatetime)

VALID: dict[str, Any] = {
    "topic": "agent:main",
    "payload": {
        "messageId": "m-1",
        "type": "tg_message",
        "from": "tg:42",
        "timestamp": "2026-05-09T07:35:25.123456+00:00",
        "content": {"text": "hello"},
    },
}


def _digits(n: int) -> st.SearchStrategy[str]:
    return st.text(alphabet="0123456789", min_size=n, max_size=n)


_offsets = st.one_of(
    st.sampled_from(["Z", "z", "+00:00", "-23:59", "+24:00", "", "+0000"]),
    st.builds("{}{}:{}".format, st.sampled_from("+-"), _digits(2), _digits(2)),
)
_timestamps = st.one_of(
    st.builds(
        "{}-{}-{}T{}:{}:{}{}{}".format,
        st.one_of(_digits(4), st.sampled_from(["2026", "2024", "0000", "9999"])),
        st.one_of(_digits(2), st.sampled_from(["01", "02", "12"])),
        st.one_of(_digits(2), st.sampled_from(["28", "29", "30", "31"])),
        st.one_of(_digits(2), st.sampled_from(["00", "23", "24"])),
        _digits(2),
        _digits(2),
        st.sampled_from(["", ".1", ".123456", ".1234567", "."]),
        _offsets,
    ),
    st.sampled_from(
        [
            "2026-05-09T07:35:25Z",
            "2026-05-09 07:35:25Z",
            "2026-05-09T07:35:25",
            "2026-02-30T07:35:25Z",
            "2026-05-09T23:59:60Z",
            "2026-05-09T07:35:25Z\n",
            "٢٠٢٦-05-09T07:35:25Z",
        ]
    ),
)
_strings = st.one_of(
    st.text(max_size=140),
    st.sampled_from(["tg_message", "tg:42", "tg_message\n", "tg:42\n", "", "x" * 129]),
)
_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
_traceparents = st.one_of(
    st.sampled_from(
        [
            _TRACE,
            "ff" + _TRACE[2:],
            _TRACE[:3] + "0" * 32 + _TRACE[35:],
            _TRACE[:36] + "0" * 16 + _TRACE[52:],
            _TRACE.upper(),
            _TRACE + "\n",
            _TRACE + "-01",
            "01" + _TRACE[2:],
        ]
    ),
    st.text(alphabet="0123456789abcdef-", min_size=50, max_size=58),
)
_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 2), st.booleans()
)
_values = st.one_of(
    _strings,
    st.integers(),
    st.none(),
    st.booleans(),
    st.lists(st.integers()),
    _traceparents,
    _numbers,
)
_keys = st.sampled_from(
    ["messageId", "type", "from", "timestamp", "content", "correlationId", "traceparent",
     "relevance", "message_id", "from_", "extra"]
)  # fmt: skip


@st.composite
def send_params(draw: st.DrawFn) -> Any:
    """Mostly valid params with a few fields replaced, added or removed."""
    payload = dict(VALID["payload"])
    for key in draw(st.lists(_keys, max_size=3)):
        choice = draw(st.integers(0, 3))
        if choice == 0:
            payload.pop(key, None)
        elif key == "timestamp":
            payload[key] = draw(st.one_of(_timestamps, _values))
        elif key == "content":
            payload[key] = draw(st.one_of(st.dictionaries(st.text(max_size=3), _values), _values))
        else:
            payload[key] = draw(_values)
    params: dict[str, Any] = {"topic": draw(st.one_of(st.just("agent:main"), _values))}
    params["payload"] = payload if draw(st.integers(0, 9)) else draw(_values)
    if not draw(st.integers(0, 9)):
        params["extra"] = 1
    return params


@settings(max_examples=500)
@given(send_params())
@example(VALID)
def test_fast_path_accepts_only_what_the_model_accepts(params):
    """Whatever the fast check accepts, the model accepts too, with the same fields."""
    fields = _fast_send_message(params)
    if fields is None:
        return
    model = SendMessageParams.model_validate(params)
    assert fields == read_send_message_slowly(params)
    assert (fields.topic, fields.message_id, fields.type, fields.sender) == (
        model.topic,
        model.payload.message_id,
        model.payload.type,
        model.payload.from_,
    )


@settings(max_examples=2000)
@given(_timestamps)
def test_fast_timestamp_check_accepts_only_aware_datetimes(text):
    """Every timestamp the fast check passes, AwareDatetime accepts."""
    if _valid_timestamp(text):
        AWARE.validate_python(text)


def read_send_message_slowly(params: Any) -> Any:
    """What read_send_message gives when the model validates (the fast path deferred)."""
    model = SendMessageParams.model_validate(params)
    payload = model.payload
    trace = payload.traceparent
    return (
        model.topic,
        payload.message_id,
        payload.type,
        payload.from_,
        payload.relevance,
        None if trace is None else trace[3:35],
    )


def test_fast_path_takes_the_usual_message():
    """A well-formed message, optional fields included, needs no model validation; the trace id
    and relevance come out of it."""
    payload = {
        **VALID["payload"],
        "correlationId": "c-1",
        "traceparent": _TRACE,
        "relevance": 0.25,
    }
    fields = _fast_send_message({"topic": "agent:main", "payload": payload})
    assert fields is not None
    assert (fields.trace_id, fields.relevance) == ("4bf92f3577b34da6a3ce929d0e0e4736", 0.25)
    assert _fast_send_message(VALID) is not None


@pytest.mark.parametrize(
    "change",
    [
        {"timestamp": "2026-05-09T07:35:25"},  # no zone: AwareDatetime refuses it
        {"timestamp": "2026-05-09T07:35:25+10:87"},  # fromisoformat would take it
        {"type": "tg_message\n"},
        {"from": "tg:42\n"},
        {"messageId": ""},
        {"content": []},
        {"extra": 1},
        {"traceparent": "ff" + _TRACE[2:]},  # version ff is invalid
        {"traceparent": _TRACE[:3] + "0" * 32 + _TRACE[35:]},  # all-zero trace id
        {"traceparent": _TRACE[:36] + "0" * 16 + _TRACE[52:]},  # all-zero parent id
        {"traceparent": _TRACE.upper()},  # W3C: lowercase only
        {"relevance": 1.5},
        {"relevance": True},
        {"relevance": "0.5"},
    ],
)
def test_invalid_params_get_the_models_error(change):
    """What the fast check refuses is validated by the model and refused with its message."""
    params = {"topic": "agent:main", "payload": {**VALID["payload"], **change}}
    assert _fast_send_message(params) is None
    with pytest.raises(ValidationError):
        SendMessageParams.model_validate(params)
    with pytest.raises(InvalidParams, match="Invalid params: payload"):
        read_send_message(params)


def test_the_model_accepts_what_the_fast_path_defers():
    """A valid but unusual message (field names instead of aliases) still goes through."""
    payload = {**VALID["payload"], "message_id": "m-2"}
    del payload["messageId"]
    params = {"topic": "agent:main", "payload": payload}
    assert _fast_send_message(params) is None
    assert read_send_message(params).message_id == "m-2"
