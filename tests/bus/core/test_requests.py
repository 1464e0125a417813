"""The bus's request decisions through the core alone: rows and replies out, no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from bus.core.actions import Fail, Record, Reply
from bus.core.errors import (
    ContentNotKept,
    DuplicateMessage,
    Forbidden,
    InvalidParams,
    LimitExceeded,
    SubscriptionNotFound,
)
from bus.core.policy import Policy
from bus.core.pushes import PushOptions
from bus.core.recent import RecentIds
from bus.core.requests import (
    LinkFacts,
    admit_admin,
    admit_fetch,
    admit_send,
    list_peers,
    list_subscriptions,
    peer_list,
    subscribe,
    unsubscribe,
)
from bus.core.router import Route, Router
from schemas.bus import ListSubscriptionsResult, SubscribeResult

POLICY = Policy.default()


def joined(client_id: str) -> tuple[Router[str], Route[str]]:
    """A routing table with one peer, ``client_id``, on the link ``"conn"``."""
    router: Router[str] = Router()
    router.join("conn", client_id, POLICY.grants(client_id, POLICY.roles_for(client_id)))
    route = router.route("conn")
    assert route is not None
    return router, route


def rows(actions: list[Any]) -> list[tuple[str, str | None]]:
    """Each Record as (event, status)."""
    return [(a.event, a.status) for a in actions if isinstance(a, Record)]


def error(actions: list[Any]) -> Exception:
    """The error a decision ends in."""
    last = actions[-1]
    assert isinstance(last, Fail)
    return last.error


def envelope(sender: str, *, type_: str = "tg_message", message_id: str = "m1") -> dict[str, Any]:
    """sendMessage params from ``sender`` to agent:w1."""
    return {
        "topic": "agent:w1",
        "payload": {
            "messageId": message_id,
            "type": type_,
            "from": sender,
            "timestamp": "2026-11-21T20:22:35Z",
            "content": {},
        },
    }


# subscribe / unsubscribe / listSubscriptions


def test_subscribe_adds_the_pattern_with_a_row_and_answers_success():
    """An allowed pattern is in the table after the decision, with its subscribe row."""
    router, route = joined("agent:w1")
    actions = subscribe(router, route, {"topic": "agent:w1"}, rpc_id="1", max_subscriptions=4)
    assert rows(actions) == [("subscribe", None)]
    assert actions[0] == Record("subscribe", actor="agent:w1", rpc_id="1", topic="agent:w1")
    assert actions[0].fields()["topic"] == "agent:w1"
    assert actions[-1] == Reply(SubscribeResult())
    assert [r.handle for r in router.targets("agent:w1")] == ["conn"]


def test_subscribe_with_options_logs_them_and_again_the_same_is_silent():
    """Options go in the row; the same subscription again changes nothing and writes none."""
    router, route = joined("agent:w1")
    params = {"topic": "agent:w1", "debounceMs": 50, "minRelevance": 0.5}
    first = subscribe(router, route, params, rpc_id=None, max_subscriptions=None)
    assert isinstance(first[0], Record)
    assert first[0].payload == {"debounceMs": 50, "minRelevance": 0.5}
    assert route.options["agent:w1"] == PushOptions(50, 0.5)
    again = subscribe(router, route, params, rpc_id=None, max_subscriptions=None)
    assert again == [Reply(SubscribeResult())]


def test_subscribe_with_new_options_replaces_them_even_at_the_limit():
    """Changing an existing pattern's options is not one subscription more."""
    router, route = joined("agent:w1")
    subscribe(router, route, {"topic": "agent:w1"}, rpc_id=None, max_subscriptions=1)
    changed = subscribe(
        router, route, {"topic": "agent:w1", "debounceMs": 10}, rpc_id=None, max_subscriptions=1
    )
    assert rows(changed) == [("subscribe", None)] and route.options["agent:w1"].debounce_ms == 10


def test_subscribe_past_the_limit_is_refused_with_its_row():
    """One pattern more than max_subscriptions gets -32005 and a limit_exceeded row."""
    router, route = joined("agent:system")
    subscribe(router, route, {"topic": "system:spawn"}, rpc_id=None, max_subscriptions=1)
    actions = subscribe(router, route, {"topic": "system:route"}, rpc_id="2", max_subscriptions=1)
    assert rows(actions) == [("limit_exceeded", "max_subscriptions")]
    assert isinstance(error(actions), LimitExceeded) and route.patterns == {"system:spawn"}


def test_subscribe_to_a_pattern_the_policy_denies_is_refused():
    """A tg peer may not subscribe to bcp topics: -32002 and a refused row."""
    router, route = joined("tg:42")
    actions = subscribe(router, route, {"topic": "bcp:*"}, rpc_id="3", max_subscriptions=None)
    assert rows(actions) == [("refused", "subscribe_denied")]
    assert isinstance(error(actions), Forbidden) and not route.patterns


@pytest.mark.parametrize("params", [None, {"topic": "a::b"}, {"topic": "x", "debounceMs": -1}])
def test_malformed_subscribe_params_fail_without_rows(params):
    """Params that are not an object, a bad pattern or a bad option get -32602, no row."""
    router, route = joined("agent:w1")
    actions = subscribe(router, route, params, rpc_id=None, max_subscriptions=None)
    assert len(actions) == 1 and isinstance(error(actions), InvalidParams)


def test_unsubscribe_drops_the_pattern_and_an_unknown_one_is_32003():
    """Unsubscribing removes a pattern with a row; a pattern not held gets -32003."""
    router, route = joined("agent:w1")
    subscribe(router, route, {"topic": "agent:w1"}, rpc_id=None, max_subscriptions=None)
    actions = unsubscribe(router, route, {"topic": "agent:w1"}, rpc_id="4")
    assert rows(actions) == [("unsubscribe", None)] and actions[-1] == Reply(SubscribeResult())
    assert not route.patterns
    again = unsubscribe(router, route, {"topic": "agent:w1"}, rpc_id="5")
    assert isinstance(error(again), SubscriptionNotFound)
    assert isinstance(error(unsubscribe(router, route, {}, rpc_id=None)), InvalidParams)


def test_list_subscriptions_is_sorted_with_options():
    """listSubscriptions shows each pattern, sorted, with its push options."""
    router, route = joined("agent:system")
    subscribe(router, route, {"topic": "system:spawn"}, rpc_id=None, max_subscriptions=None)
    subscribe(
        router,
        route,
        {"topic": "agent:system", "minRelevance": 0.25},
        rpc_id=None,
        max_subscriptions=None,
    )
    (reply,) = list_subscriptions(route)
    assert isinstance(reply, Reply) and isinstance(reply.result, ListSubscriptionsResult)
    assert reply.result.model_dump(by_alias=True) == {
        "subscriptions": [
            {"topic": "agent:system", "debounceMs": 0, "minRelevance": 0.25},
            {"topic": "system:spawn", "debounceMs": 0, "minRelevance": 0.0},
        ]
    }


# admin methods


def test_only_an_admin_may_call_list_peers():
    """An operator passes with nothing to do; anyone else is refused with a row."""
    _, operator = joined("operator:ann")
    assert admit_admin(operator, "1", "listPeers") == []
    _, tg = joined("tg:42")
    actions = admit_admin(tg, "2", "listPeers")
    assert rows(actions) == [("refused", "admin_denied")] and isinstance(error(actions), Forbidden)


# sendMessage admission


def test_a_valid_message_is_admitted_with_its_fields():
    """An allowed type from the sender itself is admitted: no actions, its fields and topic."""
    _, route = joined("tg:42")
    admission = admit_send(route, envelope("tg:42"), rpc_id="1", recent=None, now=0.0)
    assert admission.actions == [] and admission.topic == "agent:w1"
    assert admission.fields is not None and admission.fields.message_id == "m1"


def test_a_forged_from_is_refused():
    """payload.from that is not the sender gets -32002 and a from_mismatch row."""
    _, route = joined("tg:42")
    admission = admit_send(route, envelope("tg:43"), rpc_id="1", recent=None, now=0.0)
    assert rows(admission.actions) == [("refused", "from_mismatch")]
    assert isinstance(error(admission.actions), Forbidden) and admission.fields is None


def test_a_type_the_policy_denies_is_refused():
    """A type the sender's roles may not send to the topic gets -32002 and a type_denied row."""
    _, route = joined("tg:42")
    admission = admit_send(
        route, envelope("tg:42", type_="bcp_query"), rpc_id="1", recent=None, now=0.0
    )
    assert rows(admission.actions) == [("refused", "type_denied")]
    assert "tg:42 (roles: tg)" in str(error(admission.actions))


def test_a_peer_with_no_roles_is_named_so():
    """The type_denied error says 'none' for a peer the policy gives no role."""
    router: Router[str] = Router()
    router.join("conn", "nobody:1", POLICY.grants("nobody:1", ()))
    route = router.route("conn")
    assert route is not None
    admission = admit_send(route, envelope("nobody:1"), rpc_id=None, recent=None, now=0.0)
    assert "(roles: none)" in str(error(admission.actions))


def test_malformed_send_params_fail_without_rows():
    """A topic with a * cannot be published to: -32602 and no row."""
    _, route = joined("tg:42")
    params = envelope("tg:42") | {"topic": "agent:*"}
    admission = admit_send(route, params, rpc_id=None, recent=None, now=0.0)
    assert len(admission.actions) == 1 and isinstance(error(admission.actions), InvalidParams)


def test_a_duplicate_within_the_window_is_refused_and_a_release_lets_it_through():
    """The same messageId within the window gets -32009; released, it is admitted again."""
    _, route = joined("tg:42")
    recent = RecentIds(window=10.0, max_ids=None)
    assert admit_send(route, envelope("tg:42"), rpc_id="1", recent=recent, now=0.0).fields
    duplicate = admit_send(route, envelope("tg:42"), rpc_id="2", recent=recent, now=1.0)
    assert rows(duplicate.actions) == [("refused", "duplicate")]
    failure = error(duplicate.actions)
    assert isinstance(failure, DuplicateMessage) and failure.data == {"messageId": "m1"}
    recent.release(("tg:42", "m1"))
    assert admit_send(route, envelope("tg:42"), rpc_id="3", recent=recent, now=2.0).fields


# fetchMessages admission


def test_fetch_is_admitted_with_its_limit_capped():
    """A pattern the peer may subscribe to is read, the page size held within the cap."""
    _, route = joined("agent:w1")
    grants = route.grants
    read = admit_fetch(grants, "agent:w1", 500, rpc_id="1", digests_only=False, cap=100)
    assert read.actions == [] and read.pattern == "agent:w1" and read.limit == 100
    assert (
        admit_fetch(grants, "agent:w1", None, rpc_id=None, digests_only=False, cap=50).limit == 50
    )
    assert admit_fetch(grants, "agent:w1", 0, rpc_id=None, digests_only=False, cap=50).limit == 1


def test_fetch_of_a_pattern_the_policy_denies_is_refused_with_a_row():
    """Reading what one may not subscribe to gets -32002 and a fetch_denied row."""
    _, route = joined("tg:42")
    refused = admit_fetch(route.grants, "agent:*", None, rpc_id="2", digests_only=False, cap=9)
    assert rows(refused.actions) == [("refused", "fetch_denied")]
    assert isinstance(error(refused.actions), Forbidden)


def test_fetch_fails_on_a_bad_pattern_or_a_digest_log():
    """A malformed pattern is -32602; a log that keeps digests has no content to give."""
    _, route = joined("agent:w1")
    bad = admit_fetch(route.grants, "a::b", None, rpc_id=None, digests_only=False, cap=9)
    assert isinstance(error(bad.actions), InvalidParams)
    digest = admit_fetch(route.grants, "agent:w1", None, rpc_id=None, digests_only=True, cap=9)
    assert isinstance(error(digest.actions), ContentNotKept) and len(digest.actions) == 1


def test_list_peers_shows_every_peer_sorted_with_its_link():
    """Each peer once, sorted, with roles, taint, its subscriptions and its link's facts."""
    router, _ = joined("tg:42")
    router.join(
        "op", "operator:ann", POLICY.grants("operator:ann", POLICY.roles_for("operator:ann"))
    )
    router.subscribe("op", "system:presence")
    facts = {"conn": LinkFacts("10.0.0.1", 2, 1), "op": LinkFacts("hook")}
    (reply,) = list_peers(
        router.routes(),
        {"conn": None, "op": "2026-01-02T03:04:05.678Z"},
        facts.__getitem__,
        now="2026-11-21T20:22:35.000Z",
    )
    assert isinstance(reply, Reply)
    peers = reply.result.model_dump(by_alias=True, mode="json")["peers"]
    assert [p["clientId"] for p in peers] == ["operator:ann", "tg:42"]
    assert peers[0]["subscriptions"] == ["system:presence"] and peers[0]["address"] == "hook"
    assert peers[0]["inflight"] == {"requests": 0, "deliveries": 0}
    assert peers[1]["inflight"] == {"requests": 2, "deliveries": 1}
    assert peers[1]["since"].startswith("2026-11-21T20:22:35")


def test_peer_list_is_the_result_list_peers_replies_with():
    """peer_list gives the same peers as listPeers's reply, as a model a node extends."""
    router, _ = joined("tg:42")
    facts = {"conn": LinkFacts("10.0.0.1")}
    args = (list(router.routes()), {"conn": None}, facts.__getitem__)
    result = peer_list(*args, now="2026-11-21T20:22:35.000Z")
    (reply,) = list_peers(*args, now="2026-11-21T20:22:35.000Z")
    assert isinstance(reply, Reply) and reply.result == result
    assert [p.client_id for p in result.peers] == ["tg:42"]
