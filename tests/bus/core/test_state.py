"""PeerState: one link's facts beyond routing, kept and forgotten in one place, with no loop."""

from __future__ import annotations

from bus.core.state import MAX_ANONYMOUS_ERRORS, PeerState, PeerStates


class FakeTimer:
    """A timer that remembers it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_a_link_opens_empty_and_is_the_same_state_after():
    """Opening a link twice gives the one state, which starts unauthenticated."""
    states: PeerStates[str] = PeerStates()
    state = states.open("conn")
    assert states.open("conn") is state and states.get("conn") is state
    assert state.since is None and state.errors_before_init == 0
    assert len(states) == 1 and list(states) == ["conn"]


def test_joined_sets_the_time_listPeers_shows():
    """A state remembers when its peer joined."""
    state = PeerState()
    state.joined("2026-01-02T03:04:05.678Z")
    assert state.since == "2026-01-02T03:04:05.678Z"


def test_errors_before_initialize_close_the_link_at_the_limit():
    """The tenth error answer before initialize, and not one before, says close."""
    state = PeerState()
    verdicts = [state.count_error() for _ in range(MAX_ANONYMOUS_ERRORS)]
    assert verdicts == [False] * (MAX_ANONYMOUS_ERRORS - 1) + [True]


def test_closing_a_link_hands_back_its_timers_and_forgets_what_it_held():
    """close() returns the timers to cancel and drops the windows; closing again is a no-op."""
    states: PeerStates[str] = PeerStates()
    state = states.open("conn")
    timer = FakeTimer()
    state.timers["agent:w1"] = timer
    assert state.debounce.offer("agent:w1", "m1", 1.0, 0.0).push
    assert states.close("conn") == [timer]
    assert len(state.debounce) == 0 and state.timers == {}
    assert states.get("conn") is None and states.close("conn") == []


def test_close_all_releases_every_link():
    """When the bus closes, every link's timers come back once and no state is left."""
    states: PeerStates[str] = PeerStates()
    first, second = FakeTimer(), FakeTimer()
    states.open("a").timers["t"] = first
    states.open("b").timers["t"] = second
    states.open("c")
    assert states.close_all() == [first, second]
    assert len(states) == 0 and dict(states.items()) == {}
