"""The shared names and formats of schemas/common.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from schemas.common import agent_id, timestamp, trace_id, traceparent_problem

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"


def test_timestamp_is_rfc3339_utc_with_milliseconds_and_z() -> None:
    """Any aware moment is written in UTC with three decimals and a trailing Z."""
    plus_two = timezone(timedelta(hours=2))
    moment = datetime(2026, 1, 2, 5, 4, 5, 678_901, tzinfo=plus_two)
    assert timestamp(moment) == "2026-01-02T03:04:05.678Z"
    now = timestamp()
    assert now.endswith("Z") and len(now) == len("2026-01-02T03:04:05.678Z")
    assert datetime.fromisoformat(now) <= datetime.now(UTC)


def test_agent_id_prefixes_the_definition_name() -> None:
    """An agent defined as ``main`` connects as ``agent:main``."""
    assert agent_id("main") == "agent:main"


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "value",
    [
        "ff" + TRACE[2:],
        TRACE[:3] + "0" * 32 + TRACE[35:],
        TRACE[:36] + "0" * 16 + TRACE[52:],
        TRACE.upper(),
        TRACE + "\n",
        TRACE[:-1],
    ],
)
def test_traceparent_problems_are_refused_by_the_function_and_the_schema(value):
    """What W3C forbids is refused by traceparent_problem and by the envelope's JSON Schema."""
    schema = json.loads((SCHEMAS / "envelope.json").read_text(encoding="utf-8"))
    envelope = {
        "messageId": "m",
        "type": "t",
        "from": "tg:1",
        "timestamp": "2026-01-01T00:00:00Z",
        "content": {},
    }
    validator = Draft202012Validator(schema)
    assert traceparent_problem(TRACE) is None and trace_id(TRACE) == TRACE[3:35]
    assert validator.is_valid({**envelope, "traceparent": TRACE})
    assert traceparent_problem(value) is not None
    if not value.endswith("\n"):  # Python's re lets "$" match before a final newline; ECMA's not
        assert not validator.is_valid({**envelope, "traceparent": value})
