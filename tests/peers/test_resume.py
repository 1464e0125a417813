"""The SDK catching up after a reconnect: a real bus, a peer whose TCP connection is killed."""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.client import connect

from bus.core.pushes import PushOptions
from peers import Message, Peer
from peers.catchup import missed as _missed
from peers.testing import BusHarness, Inbox, running_bus, scaled
from schemas.bus import SubscriptionInfo


class _Gate:
    """A connector to the bus that waits while closed: the test decides when a peer gets back."""

    def __init__(self, h: BusHarness) -> None:
        self.url = h.url
        self.open = asyncio.Event()
        self.open.set()
        self.connects = 0
        self.reconnecting = asyncio.Event()

    async def __call__(self) -> Any:
        async with asyncio.timeout(scaled(10)):
            await self.open.wait()
        self.connects += 1
        if self.connects > 1:
            self.reconnecting.set()
        return await connect(self.url, compression=None, max_size=None)

    async def reconnected(self, peer: Peer) -> None:
        """Open the gate and wait until ``peer`` is connected, initialized and subscribed."""
        self.open.set()
        async with asyncio.timeout(scaled(10)):
            await self.reconnecting.wait()
            await peer.connected.wait()


async def _kill(h: BusHarness, client_id: str) -> None:
    """Drop the peer's TCP connection from the bus's side, as a failing network would."""
    h.bus.peers[client_id].ws.transport.abort()  # type: ignore[union-attr]


async def test_a_killed_peer_gets_what_it_missed_in_order_once(tmp_path):
    """Messages sent while the peer was away, and while it was catching up, reach its handler
    once each, in epoch order, the missed ones before the new ones."""
    async with running_bus(tmp_path) as h:
        gate, inbox = _Gate(h), Inbox()
        peer = Peer(h.url, "agent:w1", h.token("agent:w1"), connector=gate)
        peer.handle(None, inbox)
        fetching, go_on = asyncio.Event(), asyncio.Event()
        real_fetch = peer.fetch

        async def slow_fetch(*args: Any, **kwargs: Any) -> Any:
            fetching.set()  # resubscribed: from now on messages are pushed, and held
            async with asyncio.timeout(scaled(10)):
                await go_on.wait()
            return await real_fetch(*args, **kwargs)

        peer.fetch = slow_fetch  # type: ignore[method-assign]
        arrived: asyncio.Queue[None] = asyncio.Queue()
        real_process = peer._process

        def process(request: Any) -> Any:  # a processMessage reached the peer
            arrived.put_nowait(None)
            return real_process(request)

        peer._process = process  # type: ignore[method-assign]
        async with peer, h.peer("tg:42") as tg:
            before = await tg.send("agent:w1", "tg_message", {"n": 0})
            assert (await inbox.get()).epoch == before.epoch
            await arrived.get()
            gate.open.clear()
            await _kill(h, "agent:w1")
            away = [await tg.send("agent:w1", "tg_message", {"n": n}) for n in (1, 2, 3)]
            assert [r.delivered_to for r in away] == [0, 0, 0]
            gate.open.set()
            async with asyncio.timeout(scaled(10)):
                await fetching.wait()
            # Pushed (and held by the peer) and also within the range the catch-up fetches.
            both = [
                asyncio.ensure_future(tg.send("agent:w1", "tg_message", {"n": n})) for n in (4, 5)
            ]
            async with asyncio.timeout(scaled(10)):
                for _ in both:
                    await arrived.get()
            go_on.set()
            sent = [*away, *[await result for result in both]]
            got = [(await inbox.get()).epoch for _ in range(5)]
            assert got == [result.epoch for result in sent]
            assert [m.content["n"] for m in inbox.messages] == [0, 1, 2, 3, 4, 5]
            await peer.ping()
            assert inbox.empty() and gate.connects == 2
            assert peer.last_epoch == sent[-1].epoch
            assert [r.delivered_to for r in sent[3:]] == [1, 1]  # pushed, answered as duplicates


async def test_a_peer_without_resume_misses_what_was_sent_while_away(tmp_path):
    """resume=False keeps the old behaviour: nothing is fetched after the reconnect."""
    async with running_bus(tmp_path) as h:
        gate, inbox = _Gate(h), Inbox()
        peer = Peer(h.url, "agent:w1", h.token("agent:w1"), connector=gate, resume=False)
        peer.handle(None, inbox)
        async with peer, h.peer("tg:42") as tg:
            gate.open.clear()
            await _kill(h, "agent:w1")
            await tg.send("agent:w1", "tg_message", {"n": 1})
            await gate.reconnected(peer)
            await tg.send("agent:w1", "tg_message", {"n": 2})
            assert [m.content for m in [await inbox.get()]] == [{"n": 2}]
        assert not h.rows(event="fetch")


def _message(epoch: int, topic: str = "agent:w1", relevance: float | None = None) -> Message:
    payload: dict[str, Any] = {"type": "tg_message", "content": {}}
    if relevance is not None:
        payload["relevance"] = relevance
    return Message(topic, payload, epoch)


def _info(topic: str, options: PushOptions) -> SubscriptionInfo:
    return SubscriptionInfo(
        topic=topic, debounce_ms=options.debounce_ms, min_relevance=options.min_relevance
    )


def test_the_catch_up_hands_over_what_the_subscriptions_would_have_pushed():
    """In epoch order, without what was already handed or rated below minRelevance; on a
    debounced topic only the latest, with skipped."""
    subscriptions = [
        _info("agent:w1", PushOptions(min_relevance=0.5)),
        _info("agent:news", PushOptions(debounce_ms=1000)),
    ]
    fetched = [
        _message(5, "agent:news"),
        _message(1, relevance=0.9),
        _message(2, relevance=0.1),
        _message(3),
        _message(4, "agent:news"),
        _message(6, "agent:news"),
        _message(7),
    ]
    handed = _missed(subscriptions, fetched, skip={7})
    assert [(m.epoch, m.skipped) for m in handed] == [(1, None), (3, None), (6, 2)]
