"""What a bus node asks of its cluster link, on a real bus with a stand-in for the other nodes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import TypeVar

import pytest

from bus import readback
from bus.core.epochs import STREAM_STEP, Epochs
from bus.core.errors import ClusterUnavailable
from bus.core.policy import Policy
from bus.core.presence import BUS_CLIENT_ID
from bus.transports.cluster import Accepted
from peers.errors import (
    ClusterUnavailable as ClusterUnavailableError,
    EpochNotKept as EpochNotKeptError,
)
from peers.testing import Inbox, running_bus, scaled
from schemas.bus import ListPeersResult
from tests.cluster.conftest import POLICY

T = TypeVar("T")
BASE = 10**15


class OtherNodes:
    """The other nodes as the bus sees them (:class:`bus.transports.cluster.Forwarder`):
    cut off while ``cut`` is set; otherwise each message is the stream's next, and reaches
    ``answers`` of them."""

    def __init__(self, answers: tuple[int, int], epochs: Epochs) -> None:
        epochs.follow(BASE)
        self.epochs = epochs
        self.seq = 0
        self.cut = False
        self.answers = answers
        self.forwarded: list[tuple[str, str]] = []
        """(messageId, sender) of each message forwarded but the bus's own (presence)."""
        self.logins: list[str] = []

    def check(self) -> None:
        if self.cut:
            raise ClusterUnavailable()

    def joined(self, client_id: str) -> None:
        self.logins.append(client_id)

    async def sequence(self, message: Accepted, sender: str, stamp: Callable[[int], T]) -> T:
        self.check()
        self.seq += 1
        return stamp(self.epochs.at(self.seq))

    def forget(self, message: Accepted) -> None:
        pass

    async def forward(self, message: Accepted, sender: str) -> tuple[int, int]:
        if sender != BUS_CLIENT_ID:
            self.forwarded.append((message.message_id, sender))
        return self.answers

    async def list_peers(self, local: ListPeersResult) -> ListPeersResult:
        return local


async def test_a_cut_off_node_refuses_a_send_and_takes_the_same_message_once_back(tmp_path):
    """While cut off, sendMessage is -32011 and nothing is forwarded; once back, the same
    messageId is not a duplicate: it is delivered, forwarded once, and the other nodes'
    answers count in deliveredTo and in the send_finish row."""
    async with AsyncExitStack() as stack:
        harness = await stack.enter_async_context(
            running_bus(tmp_path, policy=Policy.from_yaml(POLICY))
        )
        others = OtherNodes(answers=(2, 3), epochs=harness.bus.epochs)
        harness.bus.cluster = others
        speaker = await stack.enter_async_context(harness.peer("w:0"))
        listener = Inbox(reply=True)
        hearer = harness.peer("w:1")
        hearer.handle(None, listener)
        await stack.enter_async_context(hearer)
        await hearer.subscribe("room:x")
        others.cut = True
        with pytest.raises(ClusterUnavailableError):
            await speaker.send("room:x", "note", {"text": "hi"}, message_id="m-1")
        assert others.forwarded == [] and listener.empty()
        others.cut = False
        result = await speaker.send("room:x", "note", {"text": "hi"}, message_id="m-1")
        sent_at = others.seq
        await harness.log.commit()
        finish = harness.rows(event="send_finish", message_id="m-1")
    assert result.delivered_to == 1 + 2
    assert result.epoch == BASE + sent_at * STREAM_STEP  # the stream's, not the clock's
    assert others.forwarded == [("m-1", "w:0")]
    assert others.logins == ["w:0", "w:1"]
    assert [row["status"] for row in finish] == ["delivered 3/4"]


async def test_a_message_from_another_node_is_delivered_here_and_not_forwarded_again(tmp_path):
    """deliver_forwarded gives the message the stream's epoch it is handed, delivers it to
    the subscribers here, and never hands it back to the other nodes."""
    async with AsyncExitStack() as stack:
        harness = await stack.enter_async_context(
            running_bus(tmp_path, policy=Policy.from_yaml(POLICY))
        )
        others = OtherNodes(answers=(5, 5), epochs=harness.bus.epochs)
        harness.bus.cluster = others
        listener = Inbox(reply=True)
        hearer = harness.peer("w:1")
        hearer.handle(None, listener)
        await stack.enter_async_context(hearer)
        await hearer.subscribe("room:x")
        others.seq += 7  # the stream's message, read here
        epoch = harness.bus.epochs.at(others.seq)
        envelope = {
            "messageId": "m-9",
            "type": "note",
            "from": "w:0",
            "timestamp": "2026-11-27T00:00:00+00:00",
            "content": {"text": "from b"},
        }
        answer = await harness.bus.deliver_forwarded(
            "room:x", envelope, "m-9", "note", sender=None, epoch=epoch
        )
        heard = await listener.get()
        latest = harness.bus.latest_epoch
    assert answer == (1, 1) and heard.content == {"text": "from b"}
    assert heard.epoch == epoch == latest
    assert others.forwarded == []


async def test_a_cursor_from_a_node_further_on_is_waited_for_then_refused(tmp_path, monkeypatch):
    """A cursor two stream messages past what this node read is refused (-32009) only after
    the catch-up wait; one between the last message read and the next (a local epoch of a node
    that was cut off) is answered at once, empty, with nextEpoch the cursor itself."""
    monkeypatch.setattr(readback, "CATCH_UP_WAIT", scaled(0.3))
    async with AsyncExitStack() as stack:
        harness = await stack.enter_async_context(
            running_bus(tmp_path, policy=Policy.from_yaml(POLICY))
        )
        others = OtherNodes(answers=(0, 0), epochs=harness.bus.epochs)
        harness.bus.cluster = others
        reader = await stack.enter_async_context(harness.peer("w:1"))
        read = harness.bus.epochs.read()
        started = asyncio.get_running_loop().time()
        with pytest.raises(EpochNotKeptError):
            await reader.fetch("room:x", BASE + (read + 2) * STREAM_STEP)
        waited = asyncio.get_running_loop().time() - started
        between = BASE + read * STREAM_STEP + 5
        page = await reader.fetch("room:x", between)
    assert waited >= scaled(0.3)
    assert page.messages == [] and page.next_epoch == between
