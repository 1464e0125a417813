"""A message held once: its one encoding, the byte budget in UTF-8, the slots of the intake."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bus.core import _json
from bus.core.delivery import Message
from bus.core.identities import PeerIdentity
from bus.deliveries import Params
from bus.fanout import _content
from bus.ops.config import Limits
from bus.ops.memory import return_large_blocks
from bus.transports.connection import ByteBudget, charged_context, frame_bytes, hold_request_bytes
from bus.transports.intake import LARGE, Intake
from peers import Message as Delivered
from peers.testing import running_bus, scaled

ENVELOPE = {
    "messageId": "m1",
    "type": "tg_message",
    "from": "tg:42",
    "timestamp": "2026-11-23T10:00:00Z",
}


def message(content: Any) -> Message:
    return Message("agent:w1", {**ENVELOPE, "content": content}, "m1", "tg_message", epoch=7)


def test_an_ascii_envelope_is_one_text_shared_by_its_row_and_drops_the_decoded_copy() -> None:
    """Once logged, an ASCII message holds only its text, the very object its row keeps."""
    held = message({"text": "hello"})
    row = _content(held, "full")
    assert held.decoded is None and held.encoded is row
    assert json.loads(row) == {**ENVELOPE, "content": {"text": "hello"}}
    assert held.payload == json.loads(row)  # decoded again on use, not kept
    assert held.decoded is None


def test_a_non_ascii_envelope_is_held_as_utf8_bytes_and_logged_as_the_same_text() -> None:
    """A non-ASCII message is held as bytes (a text would cache its UTF-8 form too)."""
    held = message({"text": "héllo ✓"})
    row = _content(held, "full")
    assert isinstance(held.encoded, bytes) and held.encoded.decode() == row
    assert json.loads(row)["content"] == {"text": "héllo ✓"}


def test_digest_mode_still_logs_the_type_and_hash_only() -> None:
    """log_content digest keeps the type and SHA-256 of the canonical envelope, no content."""
    row = json.loads(_content(message({"text": "secret"}), "digest"))
    assert set(row) == {"type", "sha256"} and "secret" not in json.dumps(row)


@pytest.mark.parametrize("content", [{"text": "plain"}, {"text": "ünï ✓ 😀"}, [1, 2.5, None]])
def test_the_process_message_frame_is_byte_for_byte_the_one_a_dict_gives(content: Any) -> None:
    """Splicing the encoded envelope writes the same bytes as encoding the decoded dict."""
    held = message(content)
    expected = {"topic": "agent:w1", "payload": {**ENVELOPE, "content": content}, "epoch": 7}
    params = Params(held)
    held.encode()

    class Link:  # any Connection gets the spliced form; built without a socket here
        pass

    from bus.transports.connection import Connection

    spliced = params.fit(Connection.__new__(Connection))
    assert _json.dumpb({"id": 1, "params": spliced}) == _json.dumpb({"id": 1, "params": expected})
    assert params.fit(Link()) == expected  # webhooks and the cluster read a dict


def test_frames_are_counted_in_utf8_bytes() -> None:
    """ASCII frames count their length; others their UTF-8 size, not their characters."""
    assert frame_bytes('{"a":"x"}') == 9
    assert frame_bytes('"é✓😀"') == 2 + 2 + 3 + 4


async def test_a_non_ascii_frame_over_the_budget_in_bytes_is_refused(tmp_path: Path) -> None:
    """A frame whose characters fit max_inflight_bytes but whose UTF-8 bytes do not: -32005."""
    limits = Limits(max_inflight_bytes=40_000, process_timeout=30)
    async with running_bus(tmp_path, limits=limits) as h:
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, _ignore)
            ok = await tg.send("agent:w1", "tg_message", {"text": "x" * 30_000}, message_id="a")
            assert ok.delivered_to == 1
            with pytest.raises(Exception) as refused:  # 15,000 characters, 45,000 bytes
                await tg.send("agent:w1", "tg_message", {"text": "✓" * 15_000}, message_id="b")
            assert getattr(refused.value, "code", None) == -32005


async def _ignore(message: Delivered) -> None:
    pass


class _Transport(asyncio.ReadTransport):
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False


class _Socket:
    def __init__(self) -> None:
        self.transport = _Transport()
        self.received: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.received.append(data)


def test_a_socket_reading_a_large_frame_waits_for_a_slot_and_small_ones_never_do() -> None:
    """With one slot, a second large frame stops its socket until the first is taken."""
    intake = Intake(1)
    first, second, small = _Socket(), _Socket(), _Socket()
    readers = [intake.watch(ws) for ws in (first, second, small)]
    assert all(reader is not None for reader in readers)
    first.data_received(b"x" * LARGE)  # through the reader now
    second.data_received(b"y" * LARGE)
    small.data_received(b"z" * 100)
    assert not first.transport.paused and second.transport.paused and not small.transport.paused
    assert first.received and second.received  # what was read is handed on, never dropped
    assert (intake.reading, intake.waiting) == (1, 1)
    readers[0].taken(LARGE)  # type: ignore[union-attr]
    assert not second.transport.paused and (intake.reading, intake.waiting) == (1, 0)
    readers[1].close()  # type: ignore[union-attr]
    assert intake.reading == 0


def test_an_in_process_link_is_not_watched() -> None:
    """A link without a socket (bus.transports.local) has nothing to pause."""
    assert Intake(1).watch(object()) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_serve_pins_the_mmap_threshold_on_glibc() -> None:
    """return_large_blocks() takes effect on Linux with glibc (the CI's platform)."""
    assert return_large_blocks()


async def test_a_delivery_carries_the_envelope_as_sent(tmp_path: Path) -> None:
    """A subscriber gets the envelope the sender sent, whatever form the bus held it in."""
    async with running_bus(tmp_path) as h:
        got: asyncio.Queue[Delivered] = asyncio.Queue()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:

            async def keep(message: Delivered) -> None:
                got.put_nowait(message)

            agent.handle(None, keep)
            content = {"text": "ünï ✓", "n": [1, 2.5, None]}
            await tg.send("agent:w1", "tg_message", content, message_id="c")
            async with asyncio.timeout(scaled(5)):
                delivered = await got.get()
            assert delivered.payload["content"] == content


IDENTITIES = {
    "agent:main": PeerIdentity(frozenset({"controller"}), "none"),
    "agent:researcher": PeerIdentity(frozenset({"reader"}), "high"),
}


async def test_a_delivery_the_sender_does_not_wait_for_keeps_its_bytes_charged(
    tmp_path: Path,
) -> None:
    """The bytes of a request answered before its delivery to a more tainted receiver ends stay
    charged to max_inflight_bytes until that delivery ends: the bus still holds the message."""
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        release, seen = asyncio.Event(), asyncio.Event()

        async def holds(message: Delivered) -> None:
            seen.set()
            await release.wait()

        async with h.peer("agent:main") as main, h.peer("agent:researcher") as reader:
            reader.handle(None, holds)
            await reader.subscribe("agent:researcher")
            budget = h.bus.byte_budget
            async with asyncio.timeout(scaled(5)):
                result = await main.send(
                    "agent:researcher", "agent_event", {"x": "y" * 5000}, message_id="u-1"
                )
                await seen.wait()
            assert result.delivered_to == 0  # answered: the sender does not hear this reader
            assert budget.used > 5000  # and yet its bytes are still charged
            emptied, give = asyncio.Event(), budget.give

            def give_and_tell(size: int) -> None:
                give(size)
                if not budget.used:
                    emptied.set()

            budget.give = give_and_tell  # type: ignore[method-assign]
            release.set()
            async with asyncio.timeout(scaled(5)):
                await emptied.wait()  # given back once the delivery ended


async def test_a_websockets_socket_is_watched_with_every_hook_the_intake_reaches_into(
    tmp_path: Path,
) -> None:
    """The intake reaches into websockets' internals; if an upgrade moved them, this fails."""
    import websockets

    async with running_bus(tmp_path, transport="websockets") as harness:
        door = harness.bus._door
        async with websockets.connect(harness.url) as ws:
            await ws.send('{"jsonrpc":"2.0","id":1,"method":"ping"}')
            async with asyncio.timeout(scaled(5)):
                await ws.recv()  # answered (not initialized): its Connection is running
            (conn,) = door.connections
            reader = conn._reader
            assert reader is not None  # the transport and its data_received were found
            assert reader._unparsed is not None  # protocol.reader.buffer: the frame being read
            assert reader._frames is not None  # recv_messages: the frames queued for the loop
            assert reader._assembler is not None  # and its flow control (max_queue)


async def test_a_socket_waiting_for_a_slot_is_not_resumed_by_websockets_flow_control() -> None:
    """Drained frames do not let a socket that waits for a slot read its large frame anyway."""
    from websockets.asyncio.messages import Assembler

    intake = Intake(1)
    holder, waiter = _Socket(), _Socket()
    assembler = Assembler(
        high=2, pause=waiter.transport.pause_reading, resume=waiter.transport.resume_reading
    )
    waiter.recv_messages = assembler  # type: ignore[attr-defined]
    for ws in (holder, waiter):
        intake.watch(ws)
    holder.data_received(b"x" * LARGE)  # takes the one slot
    waiter.data_received(b"y" * LARGE)
    assert waiter.transport.paused and intake.waiting == 1
    assembler.paused = True  # websockets stopped it too (its queue was full) ...
    assembler.maybe_resume()  # ... and its read loop drained the queue
    assert waiter.transport.paused  # still no slot: still not read


async def test_a_slot_freed_does_not_resume_a_socket_websockets_stopped() -> None:
    """A slot freed for a socket whose frame queue is full leaves it stopped (max_queue)."""
    from websockets.asyncio.messages import Assembler

    intake = Intake(1)
    holder, waiter = _Socket(), _Socket()
    assembler = Assembler(
        high=2, pause=waiter.transport.pause_reading, resume=waiter.transport.resume_reading
    )
    waiter.recv_messages = assembler  # type: ignore[attr-defined]
    readers = [intake.watch(ws) for ws in (holder, waiter)]
    holder.data_received(b"x" * LARGE)
    waiter.data_received(b"y" * LARGE)  # waits for the slot
    assembler.paused = True  # and its frame queue is full: its read loop is behind
    readers[0].taken(LARGE)  # type: ignore[union-attr]
    assert intake.reading == 1 and waiter.transport.paused  # the slot is its; the queue rules
    assembler.maybe_resume()  # the read loop drained the queue
    assert not waiter.transport.paused


async def test_sockets_that_never_initialize_cannot_hold_the_slots(tmp_path: Path) -> None:
    """A socket that has not initialized and stalls inside a large frame takes no slot: a
    peer's large message is still read and delivered."""
    import websockets

    limits = Limits(max_inflight_bytes=4 << 20)  # one slot
    async with running_bus(tmp_path, limits=limits) as h:
        stalled = await websockets.connect(h.url)
        try:
            # A text frame of 512 KiB announced, masked, and 128 KiB of it sent: then nothing.
            header = b"\x81\xff" + (512 << 10).to_bytes(8, "big") + b"\x00\x00\x00\x00"
            stalled.transport.write(header + b" " * (128 << 10))  # read while the peers log in
            got: asyncio.Queue[Delivered] = asyncio.Queue()
            async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:

                async def keep(message: Delivered) -> None:
                    got.put_nowait(message)

                agent.handle(None, keep)
                async with asyncio.timeout(scaled(10)):
                    await tg.send("agent:w1", "tg_message", {"text": "x" * (200 << 10)})
                    delivered = await got.get()
            assert len(delivered.payload["content"]["text"]) == 200 << 10
        finally:
            stalled.transport.abort()


def test_an_anonymous_socket_takes_a_slot_only_once_it_initialized() -> None:
    """Not initialized, a socket past LARGE stops without a slot; trusted, it takes one."""
    intake = Intake(1)
    ws = _Socket()
    reader = intake.watch(ws, anonymous=True)
    assert reader is not None
    ws.data_received(b"x" * LARGE)
    assert ws.transport.paused and (intake.reading, intake.waiting) == (0, 0)
    reader.trust()
    assert not ws.transport.paused and intake.reading == 1


async def test_an_http_send_whose_delivery_is_unheard_keeps_its_bytes_charged(
    tmp_path: Path,
) -> None:
    """Over HTTP too, a body answered before its delivery to a more tainted receiver ends stays
    charged to max_inflight_bytes until that delivery ends."""
    import httpx

    from bus.ops.config import HttpSettings

    async with running_bus(tmp_path, identities=IDENTITIES, http=HttpSettings(port=0)) as h:
        release, seen = asyncio.Event(), asyncio.Event()

        async def holds(message: Delivered) -> None:
            seen.set()
            await release.wait()

        token = h.token("agent:main")
        async with h.peer("agent:researcher") as reader, httpx.AsyncClient() as client:
            reader.handle(None, holds)
            await reader.subscribe("agent:researcher")
            budget = h.bus.byte_budget
            body = {
                "topic": "agent:researcher",
                "type": "agent_event",
                "content": {"x": "y" * 5000},
            }
            async with asyncio.timeout(scaled(5)):
                posted = await client.post(
                    f"{h.http_url}/v1/messages?wait=true",
                    json=body,
                    headers={"Authorization": f"Bearer {token}"},
                )
                await seen.wait()
            assert posted.status_code == 200 and posted.json()["deliveredTo"] == 0
            assert budget.used > 5000  # answered, and yet the bus still holds the message
            release.set()


def test_a_settled_charge_is_not_held_again():
    """Once a request's bytes went back to the budget, hold_request_bytes in its context gives
    nothing to hold: holding and releasing again would return the bytes twice."""
    budget = ByteBudget(100)
    assert budget.take(40)
    context, done = charged_context(budget, 40)
    release = context.run(hold_request_bytes)
    assert release is not None
    done()
    assert budget.used == 40  # the held delivery still holds them
    release()
    assert budget.used == 0
    assert context.run(hold_request_bytes) is None
    assert budget.used == 0
