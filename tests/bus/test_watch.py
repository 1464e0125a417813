"""The bus's per-socket watchers, with no event loop: anonymous sockets and slow consumers."""

from __future__ import annotations

from bus.core.actions import Close, Record
from bus.core.errors import CLOSE_SLOW_CONSUMER
from bus.core.logevents import LogEvent
from bus.core.watch import Anonymous, SlowConsumers, disconnect_slow


def test_anonymous_total_limit_refuses_one_more_from_anywhere():
    """Past the total, every address is refused, naming the total's limit."""
    anonymous = Anonymous(total=2, per_address=None)
    anonymous.opened("10.0.0.1")
    assert anonymous.refusal("10.0.0.2") is None
    anonymous.opened("10.0.0.2")
    assert len(anonymous) == 2
    assert anonymous.refusal("10.0.0.3") == ("max_anonymous_connections", 2)
    anonymous.closed("10.0.0.1")
    assert anonymous.refusal("10.0.0.3") is None


def test_anonymous_per_address_limit_spares_other_addresses():
    """One address at its limit is refused; another address still opens."""
    anonymous = Anonymous(total=None, per_address=1)
    anonymous.opened("10.0.0.1")
    assert anonymous.refusal("10.0.0.1") == ("max_anonymous_per_address", 1)
    assert anonymous.refusal("10.0.0.2") is None
    anonymous.closed("10.0.0.1")
    assert anonymous.refusal("10.0.0.1") is None
    assert len(anonymous) == 0
    anonymous.opened("10.0.0.2")
    anonymous.opened("10.0.0.2")
    anonymous.closed("10.0.0.2")
    assert len(anonymous) == 1 and anonymous.refusal("10.0.0.2") is not None


def test_slow_consumer_is_named_only_after_being_behind_for_the_timeout():
    """A peer behind at every check for the timeout is named once; catching up resets it."""
    slow: SlowConsumers[str] = SlowConsumers(timeout=10.0)
    assert slow.check([("a", True), ("b", True)], now=0.0) == []
    assert slow.check([("a", True), ("b", False)], now=5.0) == []  # b caught up: reset
    assert slow.check([("a", True), ("b", True)], now=9.0) == []
    assert slow.check([("a", True), ("b", True)], now=10.0) == ["a"]
    assert slow.check([("a", True), ("b", True)], now=12.0) == []  # a starts over
    assert slow.check([("b", True)], now=19.0) == ["b"]


def test_forgotten_peer_starts_over():
    """A peer that left and came back (same key) is not charged its old time."""
    slow: SlowConsumers[str] = SlowConsumers(timeout=1.0)
    slow.check([("a", True)], now=0.0)
    slow.forget("a")
    slow.forget("never-seen")
    assert slow.check([("a", True)], now=5.0) == []


def test_a_slow_consumer_gets_a_row_and_a_forced_4004():
    """A peer named by check() is logged with its unread bytes and force-closed with 4004."""
    row, close = disconnect_slow("c1", "agent:w1", 70000, 2.5)
    assert row == Record(
        LogEvent.SLOW_CONSUMER,
        actor="agent:w1",
        status=str(CLOSE_SLOW_CONSUMER),
        error="70000 bytes unread, nothing written for 2.5s",
    )
    assert close == Close("c1", CLOSE_SLOW_CONSUMER, "slow consumer", force=True)
