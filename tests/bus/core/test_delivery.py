"""Who gets a message, through the core alone: taint, minRelevance, debounce and its flush."""

from __future__ import annotations

from bus.core.delivery import Message, SetTimer, flush, outcome, targets
from bus.core.policy import Policy
from bus.core.pushes import PushOptions
from bus.core.router import Router
from bus.core.state import PeerStates

POLICY = Policy.default()


def table(*peers: tuple[str, str, str | None]) -> Router[str]:
    """A routing table of (link, clientId, taint) peers, each subscribed to agent:w1."""
    router: Router[str] = Router()
    for link, client_id, taint in peers:
        grants = POLICY.grants(client_id, POLICY.roles_for(client_id), taint=taint)  # type: ignore[arg-type]
        router.join(link, client_id, grants)
        router.subscribe(link, "agent:w1")
    return router


def message(type_: str = "tg_message", relevance: float | None = None) -> Message:
    """A message on agent:w1 with epoch 5."""
    return Message("agent:w1", {}, "m1", type_, trace_id="t", relevance=relevance, epoch=5)


def statuses(picked) -> list[tuple[str, str, str | None]]:
    """Each row as (event, actor, status)."""
    return [(row.event, row.actor, row.status) for row in picked.rows]


def never() -> float:
    """A clock that must not be read."""
    raise AssertionError("the clock was read")


def test_every_subscriber_but_the_sender_is_a_target():
    """Plain subscribers are targets with no row of the core's (the shell writes each one's
    process_start); nothing is held, so no timer."""
    router = table(("a", "agent:w1", None), ("b", "operator:ann", None))
    sender = router.route("a")
    picked = targets(router, PeerStates(), message(), sender=sender, clock=never)
    assert [r.handle for r in picked.routes] == ["b"] and picked.timers == []
    assert picked.rows == []


def test_a_row_for_a_peer_left_out_carries_the_epoch_and_trace_id():
    """A refused target's row names the message: its epoch and trace id."""
    router = table(("r", "agent:r", "high"), ("c", "agent:c", None))
    picked = targets(router, PeerStates(), message(), sender=router.route("r"), clock=never)
    assert picked.rows[0].epoch == 5 and picked.rows[0].trace_id == "t"
    assert picked.rows[0].message_id == "m1" and picked.rows[0].topic == "agent:w1"


def test_a_tainted_sender_does_not_write_down():
    """A high-taint sender's message is refused to a clean peer, with the levels in the row."""
    router = table(("r", "agent:r", "high"), ("c", "agent:c", None))
    picked = targets(router, PeerStates(), message(), sender=router.route("r"), clock=never)
    assert picked.routes == []
    assert statuses(picked) == [("taint_refused", "agent:c", "high->none")]


def test_raw_reader_text_is_high_whoever_carries_it():
    """A bcp_screen_request goes to high-taint peers only, and its row says high."""
    router = table(("g", "agent:g", None), ("c", "agent:c", "low"))
    msg = message("bcp_screen_request")
    picked = targets(router, PeerStates(), msg, sender=router.route("g"), clock=never)
    assert statuses(picked) == [("taint_refused", "agent:c", "high->low")]


def test_the_bus_itself_reaches_everyone():
    """With no sender (presence), no taint check applies."""
    router = table(("r", "agent:r", "high"), ("c", "agent:c", None))
    picked = targets(router, PeerStates(), message(), sender=None, clock=never)
    assert sorted(r.handle for r in picked.routes) == ["c", "r"]


def test_min_relevance_skips_a_message_rated_too_low():
    """A subscription with minRelevance 0.5 does not get a message rated 0.2."""
    router = table(("a", "agent:w1", None))
    router.subscribe("a", "agent:w1", PushOptions(min_relevance=0.5))
    low = targets(router, PeerStates(), message(relevance=0.2), sender=None, clock=never)
    assert statuses(low) == [("push_skipped", "agent:w1", "min_relevance")]
    high = targets(router, PeerStates(), message(relevance=0.9), sender=None, clock=never)
    assert [r.handle for r in high.routes] == ["a"]


def test_debounce_pushes_the_first_holds_the_next_and_sets_one_timer():
    """In a window the first message goes, the second is held with a timer, the third not."""
    router = table(("a", "agent:w1", None))
    router.subscribe("a", "agent:w1", PushOptions(debounce_ms=100))
    states: PeerStates[str] = PeerStates()
    first = targets(router, states, message(), sender=None, clock=lambda: 1.0)
    assert [r.handle for r in first.routes] == ["a"]
    second = targets(router, states, message(), sender=None, clock=lambda: 1.01)
    assert statuses(second) == [("push_skipped", "agent:w1", "debounce")]
    assert second.timers == [SetTimer("a", "agent:w1", 1.1)]
    third = targets(router, states, message(), sender=None, clock=lambda: 1.02)
    assert third.routes == [] and third.timers == []


def test_flush_pushes_the_latest_held_with_how_many_it_replaced():
    """At the window's end the latest held message goes, skipping the one it replaced."""
    router = table(("a", "agent:w1", None))
    router.subscribe("a", "agent:w1", PushOptions(debounce_ms=100))
    states: PeerStates[str] = PeerStates()
    held = [message(), message(), message()]
    for i, msg in enumerate(held):
        targets(router, states, msg, sender=None, clock=lambda i=i: 1.0 + i / 100)
    states.open("a").timers["agent:w1"] = states  # type: ignore[assignment]
    due = flush(router, states, "a", "agent:w1", 1.1)
    assert due is not None and due[1] is held[2] and due[2] == 1
    assert "agent:w1" not in states.open("a").timers
    assert flush(router, states, "a", "agent:w1", 1.2) is None  # nothing held now


def test_flush_pushes_nothing_that_was_aborted_unsubscribed_or_gone():
    """A refused message, a dropped subscription or a link gone: the flush pushes nothing."""
    router = table(("a", "agent:w1", None))
    router.subscribe("a", "agent:w1", PushOptions(debounce_ms=100))
    states: PeerStates[str] = PeerStates()
    aborted = message()
    targets(router, states, message(), sender=None, clock=lambda: 1.0)
    targets(router, states, aborted, sender=None, clock=lambda: 1.01)
    aborted.aborted = True
    assert flush(router, states, "a", "agent:w1", 1.1) is None
    targets(router, states, message(), sender=None, clock=lambda: 1.11)
    router.unsubscribe("a", "agent:w1")
    assert flush(router, states, "a", "agent:w1", 1.2) is None
    assert flush(router, states, "gone", "agent:w1", 1.2) is None
    router.subscribe("a", "agent:w1", PushOptions(debounce_ms=100))
    targets(router, states, message(), sender=None, clock=lambda: 1.3)
    router.leave("a")
    assert flush(router, states, "a", "agent:w1", 1.4) is None


def test_outcome_reads_a_processMessage_answer():
    """processed: true is processed; anything else is not, with the peer's reason kept short."""
    assert outcome({"processed": True}) == ("processed", None)
    assert outcome({"processed": False, "status": "busy", "message": "later"}) == (
        "not_processed",
        "busy: later",
    )
    assert outcome({"processed": False, "message": "x" * 500})[1] == (": " + "x" * 500)[:200]
    assert outcome(["processed"]) == ("not_processed", "malformed processMessage result")
