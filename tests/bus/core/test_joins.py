"""Joining the bus through the core alone: initialize, takeover, webhook peers, leaving."""

from __future__ import annotations

from typing import Any

from bus.core.actions import Announce, Close, CountRefusal, Fail, Record, Reply
from bus.core.errors import (
    CLOSE_AUTH_FAILED,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    CLOSE_TRY_AGAIN_LATER,
    AuthenticationFailed,
    LimitExceeded,
)
from bus.core.identities import PeerIdentity
from bus.core.joins import (
    Ask,
    Credential,
    Rules,
    WrongToken,
    attach,
    grant,
    initialize,
    join,
    leave,
    regrant,
    replaced_elsewhere,
    revoke,
)
from bus.core.logevents import LogEvent
from bus.core.policy import Policy
from bus.core.router import Router
from schemas.bus import InitializeResult

POLICY = Policy.default()


def rules(max_connections: int | None = None, **identities: PeerIdentity) -> Rules:
    """The default policy, with ``identities`` by clientId."""
    return Rules(POLICY, identities, max_connections, "bus-1", "1.2.3")


def ask(client_id: str, *, token: bool = True) -> Ask:
    """An initialize from 10.0.0.1."""
    return Ask(client_id, "1", "10.0.0.1", token, "('10.0.0.1', 5000)")


def init(router: Router[str], link: str, client_id: str, **kwargs: Any) -> list[Any]:
    """initialize ``link`` as ``client_id`` with a good credential."""
    return initialize(
        router,
        link,
        kwargs.pop("credential", Credential((), "hash")),
        ask(client_id),
        kwargs.pop("rules", rules()),
        attached=kwargs.pop("attached", lambda handle: False),
        epoch=7,
    )


def events(actions: list[Any]) -> list[str]:
    """Each action as a short name: rows by event, the rest by kind."""
    names = {Announce: "announce", Close: "close", CountRefusal: "count", Reply: "reply"}
    return [a.event if isinstance(a, Record) else names.get(type(a), "fail") for a in actions]


def test_initialize_joins_subscribes_logs_announces_and_welcomes():
    """A good credential joins the peer to its own clientId, with rows, presence and result."""
    router: Router[str] = Router()
    actions = init(router, "c1", "agent:w1")
    assert events(actions) == ["connect", "initialize", "announce", "reply"]
    assert actions[0] == Record("connect", actor="('10.0.0.1', 5000)")
    assert actions[1].payload == {"roles": ["agent"], "taint": "none"}
    reply = actions[-1].result
    assert isinstance(reply, InitializeResult)
    assert reply.model_dump(by_alias=True) == {
        "serverId": "bus-1",
        "serverInfo": {"name": "bcpbus", "version": "1.2.3"},
        "capabilities": {
            "subscribe": True,
            "publish": True,
            "processMessage": True,
            "topics": ["agent:w1"],
        },
        "epoch": 7,
    }
    route = router.route("c1")
    assert route is not None and route.patterns == {"agent:w1"} and route.credential == "hash"


def test_a_wrong_or_missing_token_is_counted_not_logged_and_closes():
    """No credential: a ws_refused count, a 4003 close after the answer, and no row."""
    router: Router[str] = Router()
    for given, reason in ((True, "wrong_token"), (False, "no_credential")):
        actions = initialize(
            router, "c1", None, ask("agent:w1", token=given), rules(), attached=bool, epoch=0
        )
        assert actions[0] == CountRefusal(reason, "10.0.0.1")
        assert actions[1] == Close("c1", CLOSE_AUTH_FAILED, "authentication failed", True)
        assert isinstance(actions[2], Fail) and isinstance(actions[2].error, WrongToken)
    assert len(router) == 0


def test_a_second_link_takes_over_and_closes_the_first():
    """The same clientId again: replaced row, peer_left, the old link closed with 4001."""
    router: Router[str] = Router()
    init(router, "c1", "agent:w1")
    actions = init(router, "c2", "agent:w1")
    assert events(actions)[:3] == ["replaced", "announce", "close"]
    assert actions[2] == Close("c1", CLOSE_REPLACED, "replaced by a newer connection")
    assert router.route("c1") is None and router.route_of("agent:w1") is not None


def test_a_webhook_peer_cannot_also_connect():
    """A clientId the bus reaches at a URL is refused a socket with 4003 and a row."""
    router: Router[str] = Router()
    init(router, "hook", "agent:w1")
    actions = init(router, "c1", "agent:w1", attached=lambda handle: handle == "hook")
    assert events(actions) == ["auth_failed", "close", "fail"]
    assert actions[0].status == "webhook" and actions[1].after_answer
    assert isinstance(actions[2].error, AuthenticationFailed)


def test_max_connections_refuses_one_more_but_not_a_takeover():
    """At the limit a new peer gets -32005 and 1013; an existing clientId may still take over."""
    router: Router[str] = Router()
    init(router, "c1", "agent:w1", rules=rules(1))
    full = init(router, "c2", "agent:w2", rules=rules(1))
    assert events(full) == ["limit_exceeded", "close", "fail"]
    assert full[1].code == CLOSE_TRY_AGAIN_LATER and isinstance(full[2].error, LimitExceeded)
    assert events(init(router, "c3", "agent:w1", rules=rules(1)))[-1] == "reply"
    assert events(init(router, "c4", "agent:w5"))[-1] == "reply"  # no limit


def test_roles_the_policy_refuses_fail_with_a_row_and_close():
    """Claiming the gateway role as a non-member is refused: auth_failed policy, 4003."""
    router: Router[str] = Router()
    actions = init(router, "c1", "agent:w1", credential=Credential(["gateway"]))
    assert events(actions) == ["auth_failed", "close", "fail"]
    assert actions[0].status == "policy" and len(router) == 0


def test_grant_without_a_link_closes_nothing():
    """A refusal for a request without a link (HTTP) has a row and an error, no close."""
    refused = grant(rules(), "agent:w1", ["gateway"], rpc_id="9")
    assert refused.grants is None and events(refused.actions) == ["auth_failed", "fail"]
    granted = grant(rules(**{"agent:r": PeerIdentity(taint="high")}), "agent:r", [])
    assert granted.actions == [] and granted.grants is not None
    assert granted.grants.taint == "high"


def test_join_without_own_topic_rights_subscribes_nothing():
    """A peer whose roles may not subscribe to its own clientId joins with no pattern."""
    router: Router[str] = Router()
    actions = join(router, "c1", "nobody:1", frozenset(), POLICY.grants("nobody:1", ()))
    assert events(actions) == ["announce"]
    route = router.route("c1")
    assert route is not None and not route.patterns


def test_attach_names_the_link_and_a_refusal_joins_nothing():
    """A webhook peer's initialize row names its link; refused roles leave the table empty."""
    router: Router[str] = Router()
    actions = attach(router, "hook", "agent:w1", [], rules(), name="https://x/hook")
    assert events(actions) == ["initialize", "announce"]
    assert actions[0].payload["link"] == "https://x/hook"
    refused = attach(router, "hook2", "agent:w2", ["gateway"], rules(), name="n")
    assert events(refused) == ["auth_failed", "fail"] and router.route("hook2") is None


def test_leave_logs_and_announces_once():
    """Leaving logs a disconnect and peer_left; a link that never joined leaves silently."""
    router: Router[str] = Router()
    init(router, "c1", "agent:w1")
    actions = leave(router, "c1", "1000")
    assert actions[0] == Record("disconnect", actor="agent:w1", status="1000")
    assert isinstance(actions[1], Announce) and actions[1].kind == "peer_left"
    assert leave(router, "c1", "1000") == []


def test_revoke_takes_the_peer_out_at_once_and_closes_it_with_4005():
    """A revoked peer leaves the table, with its row, presence and a 4005 close."""
    router: Router[str] = Router()
    init(router, "c1", "agent:w1")
    route = router.route("c1")
    assert route is not None
    actions = revoke(router, route, "rotated", "agent:w1's token was replaced")
    assert events(actions) == ["revoked", "announce", "close"]
    assert actions[0].error == "agent:w1's token was replaced"
    assert actions[1].content.reason == "revoked"
    assert actions[2] == Close("c1", CLOSE_REVOKED, "revoked: rotated")
    assert router.route("c1") is None and router.targets("agent:w1") == []


def test_replaced_elsewhere_closes_the_link_here_with_4001_and_announces_nothing():
    """A login on another node takes the peer out here, with its row naming that node."""
    router: Router[str] = Router()
    init(router, "c1", "agent:w1")
    actions = replaced_elsewhere(router, "agent:w1", "node-b")
    assert actions == [
        Record(LogEvent.REPLACED, actor="agent:w1", status=str(CLOSE_REPLACED), error="node-b"),
        Close("c1", CLOSE_REPLACED, "replaced by a link on node-b"),
    ]
    assert router.route("c1") is None and router.targets("agent:w1") == []
    assert leave(router, "c1", "1000") == []  # its close later logs no disconnect


def test_replaced_elsewhere_does_nothing_for_a_peer_not_on_this_node():
    """A clientId with no link here gives no actions: the caller reports it was not here."""
    router: Router[str] = Router()
    assert replaced_elsewhere(router, "agent:w1", "node-b") == []


def test_regrant_drops_the_patterns_the_new_grants_refuse():
    """New grants are in force and each dropped pattern is unsubscribed with its row."""
    router: Router[str] = Router()
    init(router, "c1", "agent:w1")
    route = router.route("c1")
    assert route is not None
    narrower = POLICY.grants("agent:w1", ())
    actions = regrant(router, route, narrower, ["agent:w1"])
    assert actions == [
        Record(LogEvent.UNSUBSCRIBE, actor="agent:w1", topic="agent:w1", status="revoked")
    ]
    assert route.grants is narrower and not route.patterns
    assert regrant(router, route, narrower, []) == []
