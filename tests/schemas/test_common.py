"""The shared names and formats of schemas/common.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from schemas.common import agent_id, timestamp


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
