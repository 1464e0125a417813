"""Console sessions: idle and absolute timeouts, the cap, and the token check."""

from __future__ import annotations

from bus.ops.credentials import Credentials
from peers.console.sessions import Sessions, SessionSettings, same_secret


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_when_idle_and_at_its_lifetime():
    """Unused for ``idle`` seconds, or older than ``lifetime``, a session is gone."""
    clock = Clock()
    sessions = Sessions(SessionSettings(idle=10, lifetime=25), clock=clock)
    session = sessions.start("human:alice", "t")
    clock.now = 9
    assert sessions.get(session.id) is session
    clock.now = 18
    assert sessions.get(session.id, touch=False) is session  # a stream does not count as use
    clock.now = 20
    assert sessions.get(session.id) is None
    other = sessions.start("human:alice", "t")
    for moment in (25, 30, 40):
        clock.now = moment
        assert sessions.get(other.id) is other
    clock.now = 45.1
    assert sessions.get(other.id) is None  # 25 s after it started, used or not
    assert len(sessions) == 0


def test_the_least_recently_used_session_makes_room_past_the_cap():
    """Past ``max_sessions`` the session used longest ago ends."""
    clock = Clock()
    sessions = Sessions(SessionSettings(max_sessions=2), clock=clock)
    first = sessions.start("human:a", "1")
    clock.now = 1
    second = sessions.start("human:b", "2")
    clock.now = 2
    sessions.get(first.id)
    third = sessions.start("human:c", "3")
    assert sessions.get(second.id) is None
    assert sessions.get(first.id) is first and sessions.get(third.id) is third


def test_a_session_holds_while_its_token_is_the_peers():
    """Rotating or removing the token makes the session invalid; ids and CSRF are random."""
    credentials = Credentials.empty()
    token = credentials.add("human:alice", [])
    sessions = Sessions()
    session = sessions.start("human:alice", token)
    assert session.still_valid(credentials)
    assert session.id != sessions.start("human:alice", token).id
    credentials.add("human:alice", [])
    assert not session.still_valid(credentials)
    fresh = credentials.add("human:alice", [])
    credentials.remove("human:alice")
    assert not sessions.start("human:alice", fresh).still_valid(credentials)


def test_secrets_compare_whole():
    """A CSRF value matches only itself; a missing one never does."""
    assert same_secret("abc", "abc")
    assert not same_secret("abd", "abc") and not same_secret(None, "abc")
    assert not same_secret("", "abc")
