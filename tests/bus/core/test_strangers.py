"""Links that have not authenticated, through the core alone: counted, then closed."""

from __future__ import annotations

from bus.core.actions import Close, CountRefusal, Record
from bus.core.errors import CLOSE_POLICY_VIOLATION
from bus.core.logevents import LogEvent
from bus.core.state import MAX_ANONYMOUS_ERRORS, PeerState
from bus.core.strangers import TOO_MANY_ERRORS, error_answered, frame_refused


def test_anonymous_errors_are_counted_then_the_link_closes():
    """Each error is one count; the tenth also closes the link with 1008, after the answer."""
    state = PeerState()
    for _ in range(MAX_ANONYMOUS_ERRORS - 1):
        assert error_answered(state, "c", "10.0.0.1", closing=False) == [
            CountRefusal("rpc_error", "10.0.0.1")
        ]
    last = error_answered(state, "c", "10.0.0.1", closing=False)
    assert last == [
        CountRefusal("rpc_error", "10.0.0.1"),
        CountRefusal("anonymous_errors", "10.0.0.1"),
        Close("c", CLOSE_POLICY_VIOLATION, TOO_MANY_ERRORS, True),
        Close("c", CLOSE_POLICY_VIOLATION, TOO_MANY_ERRORS),
    ]


def test_a_closing_or_unknown_link_is_only_counted():
    """A link closing after this answer, or one with no state, gets the count and no close."""
    state = PeerState(errors_before_init=MAX_ANONYMOUS_ERRORS)
    assert error_answered(state, "c", "a", closing=True) == [CountRefusal("rpc_error", "a")]
    assert error_answered(None, "c", "a", closing=False) == [CountRefusal("rpc_error", "a")]
    assert state.errors_before_init == MAX_ANONYMOUS_ERRORS


def test_a_refused_frame_is_a_row_for_a_peer_and_a_count_for_a_stranger():
    """frame_refused and frame_too_large: counted when anonymous, a row with the peer's name."""
    event = LogEvent.FRAME_TOO_LARGE
    assert frame_refused(event, None, "a", error="limit 9") == [
        CountRefusal("frame_too_large", "a")
    ]
    assert frame_refused(event, "agent:w1", "a", error="limit 9") == [
        Record(event, actor="agent:w1", error="limit 9")
    ]
