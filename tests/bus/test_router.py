"""The routing table, with no event loop: membership, takeover, subscriptions, targets."""

from __future__ import annotations

import pytest

from bus.core.policy import Policy
from bus.core.pushes import PLAIN, PushOptions
from bus.core.router import Router

POLICY = Policy.default()


def grants(client_id: str):
    return POLICY.grants(client_id, POLICY.roles_for(client_id, ()))


def joined(*pairs: tuple[str, str]) -> Router[str]:
    router: Router[str] = Router()
    for handle, client_id in pairs:
        assert router.join(handle, client_id, grants(client_id)) is None
    return router


def test_join_makes_a_peer_and_leave_forgets_it():
    """A joined handle has a route under its clientId until it leaves."""
    router = joined(("c1", "tg:1"))
    assert len(router) == 1 and "tg:1" in router
    assert router.peers == {"tg:1": "c1"}
    route = router.route("c1")
    assert route is not None and route.client_id == "tg:1" and route.handle == "c1"
    assert [r.client_id for r in router.routes()] == ["tg:1"]
    assert router.leave("c1") is route
    assert router.route("c1") is None and len(router) == 0 and "tg:1" not in router


def test_leave_of_an_unknown_handle_is_none():
    """Leaving without having joined returns None and changes nothing."""
    router = joined(("c1", "tg:1"))
    assert router.leave("c2") is None
    assert len(router) == 1


def test_takeover_returns_the_old_handle_and_drops_its_subscriptions():
    """A second join of a clientId replaces the first; the old handle routes nothing."""
    router = joined(("old", "agent:w1"))
    router.subscribe("old", "agent:w1")
    assert router.join("new", "agent:w1", grants("agent:w1")) == "old"
    assert router.route("old") is None
    assert router.leave("old") is None  # the takeover already forgot it
    assert router.targets("agent:w1") == []
    router.subscribe("new", "agent:w1")
    assert [r.handle for r in router.targets("agent:w1")] == ["new"]
    assert router.peers == {"agent:w1": "new"}


def test_subscribe_once_and_unsubscribe():
    """A pattern is added once; unsubscribing what was never subscribed is False."""
    router = joined(("c1", "agent:w1"))
    assert router.subscribe("c1", "agent:*") is True
    assert router.subscribe("c1", "agent:*") is False
    assert router.route("c1").patterns == {"agent:*"}
    assert router.unsubscribe("c1", "agent:*") is True
    assert router.unsubscribe("c1", "agent:*") is False
    assert router.unsubscribe("nobody", "agent:*") is False
    assert router.targets("agent:w2") == []


def test_subscribe_before_join_is_a_key_error():
    """Only a joined handle may subscribe."""
    with pytest.raises(KeyError):
        Router[str]().subscribe("c1", "agent:*")


def test_targets_are_each_peer_once_and_never_the_sender():
    """A peer matched by several patterns is one target; the sender is excluded."""
    router = joined(("a", "agent:a"), ("b", "agent:b"), ("c", "agent:c"))
    router.subscribe("a", "agent:*")
    router.subscribe("a", "agent:b")
    router.subscribe("b", "agent:b")
    router.subscribe("c", "agent:*:x")
    found = sorted(r.handle for r in router.targets("agent:b"))
    assert found == ["a", "b"]
    assert [r.handle for r in router.targets("agent:b", sender="b")] == ["a"]
    assert sorted(r.handle for r in router.targets("agent:b:x")) == ["a", "c"]


def test_leaving_removes_every_pattern_from_the_index():
    """After leave, none of the handle's patterns match anything."""
    router = joined(("a", "agent:a"), ("b", "agent:b"))
    router.subscribe("a", "agent:*")
    router.subscribe("a", "system:presence")
    router.subscribe("b", "agent:*")
    router.leave("a")
    assert [r.handle for r in router.targets("agent:z")] == ["b"]
    assert router.targets("system:presence") == []


def test_push_options_are_kept_per_pattern_and_dropped_with_it():
    """Options replace on a second subscribe, plain options keep nothing, unsubscribe drops
    them; options_for lists the options of every matching pattern."""
    router = joined(("c1", "agent:w1"))
    quiet = PushOptions(debounce_ms=500)
    assert router.subscribe("c1", "agent:*", quiet) is True
    router.subscribe("c1", "agent:w1")
    route = router.route("c1")
    assert route.options == {"agent:*": quiet}
    assert sorted(route.options_for("agent:w1"), key=lambda o: o.debounce_ms) == [PLAIN, quiet]
    assert route.options_for("system:x") == []
    assert router.subscribe("c1", "agent:*", PLAIN) is False
    assert route.options == {}
    router.subscribe("c1", "agent:*", quiet)
    router.unsubscribe("c1", "agent:*")
    assert route.options == {}
