"""The bus end to end: a real server on port 0, real peers, a real SQLite log."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bus.core.errors import (
    AuthenticationFailed,
    InvalidParams,
    LimitExceeded,
    MethodNotFound,
    SubscriptionNotFound,
)
from bus.core.identities import PeerIdentity
from bus.ops.config import Limits
from bus.server import BUS_CLIENT_ID, PRESENCE_TOPIC
from peers import Message, Peer, Reply
from peers.testing import Inbox, running_bus, scaled
from schemas.bus import PRESENCE_MODELS, Envelope
from schemas.common import timestamp

pytestmark = pytest.mark.usefixtures("each_transport")
"""Every test here runs on both WebSocket transports (tests/bus/conftest.py)."""

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"

IDENTITIES = {
    "agent:main": PeerIdentity(frozenset({"controller"}), "none"),
    "agent:researcher": PeerIdentity(frozenset({"reader"}), "high"),
}


def _schema_errors(name: str, instance: Any) -> list[str]:
    """What the committed ``schemas/json/<name>.json`` finds wrong with ``instance``."""
    schema = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
    return [error.message for error in Draft202012Validator(schema).iter_errors(instance)]


async def raw_call(ws: Any, method: str, params: Any = None, request_id: int = 1) -> Any:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    await ws.send(json.dumps(message))
    async with asyncio.timeout(scaled(5)):
        return json.loads(await ws.recv())


async def test_two_peers_exchange_a_message_and_the_log_has_every_row(tmp_path):
    """A tg peer's message reaches the subscribed agent; all four events are committed first."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, inbox)
            await agent.subscribe("agent:w1")
            result = await tg.send("agent:w1", "tg_message", {"text": "hello"}, message_id="m-1")
            assert result.model_dump(by_alias=True) == {
                "accepted": True,
                "messageId": "m-1",
                "deliveredTo": 1,
                "epoch": result.epoch,
            }
            message = await inbox.get()
            assert message.epoch == result.epoch > 0
            assert message.content == {"text": "hello"}
            assert message.sender == "tg:42" and message.topic == "agent:w1"
            # Committed before the answer: readable at once from another connection.
            events = [row["event"] for row in h.rows(message_id="m-1")]
            assert events == ["send_start", "process_start", "process_finish", "send_finish"]
            assert {row["epoch"] for row in h.rows(message_id="m-1")} == {result.epoch}
            start = h.rows(message_id="m-1", event="send_start")[0]
            envelope = json.loads(start["payload_json"])  # the whole envelope, as sent
            assert envelope["type"] == "tg_message" and envelope["content"] == {"text": "hello"}
            assert envelope["messageId"] == "m-1" and envelope["from"] == "tg:42"
            finish = h.rows(message_id="m-1", event="process_finish")[0]
            assert finish["actor"] == "agent:w1" and finish["status"] == "processed"


async def test_request_before_initialize_is_32001(tmp_path):
    """Anything but initialize first gets -32001, even an unknown method."""
    async with running_bus(tmp_path) as h, connect(h.url) as ws:
        assert (await raw_call(ws, "subscribe", {"topic": "a"}))["error"]["code"] == -32001
        assert (await raw_call(ws, "nope"))["error"]["code"] == -32001


async def test_wrong_token_is_refused_logged_and_closed(tmp_path):
    """A bad token gets -32002 and close code 4003; anyone can try, so the refusal is counted
    into a ws_refused row, not given an auth_failed row of its own."""
    async with running_bus(tmp_path) as h:
        h.token("agent:w1")
        async with connect(h.url) as ws:
            reply = await raw_call(
                ws, "initialize", {"clientId": "agent:w1", "auth": {"token": "wrong"}}
            )
            assert reply["error"]["code"] == -32002
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(scaled(5)):
                    await ws.recv()
            assert ws.close_code == 4003
        with pytest.raises(AuthenticationFailed):
            await Peer(h.url, "agent:nobody", "x" * 40, reconnect=False).connect()
        assert await h.refused() == {"wrong_token": 2}
        assert not h.rows(event="auth_failed")


async def test_bearer_header_authenticates(tmp_path):
    """The token may come in an Authorization: Bearer header instead of initialize params."""
    async with running_bus(tmp_path) as h:
        bearer = {"Authorization": f"Bearer {h.token('agent:w1')}"}
        async with connect(h.url, additional_headers=bearer) as ws:
            reply = await raw_call(ws, "initialize", {"clientId": "agent:w1"})
        assert reply["result"]["serverInfo"]["name"] == "bcpbus", reply
        assert "agent:w1" in reply["result"]["capabilities"]["topics"]


async def test_malformed_client_id_is_invalid_params(tmp_path):
    """A clientId with '*' or no prefix is refused as invalid params."""
    async with running_bus(tmp_path) as h, connect(h.url) as ws:
        reply = await raw_call(ws, "initialize", {"clientId": "agent:*", "auth": {"token": "t"}})
        assert reply["error"]["code"] == -32602


async def test_unknown_method_and_second_initialize(tmp_path):
    """After initialize an unknown method is -32601 and a second initialize is -32004."""
    async with running_bus(tmp_path) as h, h.peer("agent:w1") as peer:
        with pytest.raises(MethodNotFound):
            await peer.request("frobnicate")
        with pytest.raises(Exception) as caught:
            await peer.request("initialize", {"clientId": "agent:w1", "auth": {"token": "t"}})
        assert caught.value.code == -32004  # type: ignore[attr-defined]
        assert (await peer.ping()).pong is True


async def test_forged_from_is_refused(tmp_path):
    """A payload whose from is not the sender's clientId is -32602 and a refused row."""
    async with running_bus(tmp_path) as h, h.peer("tg:42") as tg:
        payload = {
            "messageId": "forged-1",
            "type": "tg_message",
            "from": "tg:43",
            "timestamp": "2026-11-21T10:00:00Z",
            "content": {},
        }
        with pytest.raises(InvalidParams):
            await tg.request("sendMessage", {"topic": "agent:w1", "payload": payload})
        [row] = h.rows(event="refused", message_id="forged-1")
        assert row["status"] == "from_mismatch" and row["actor"] == "tg:42"


async def test_type_not_allowed_for_role_is_refused(tmp_path):
    """An agent may not send tg_message, nor gateway-only BCP types."""
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        async with h.peer("agent:w1") as agent, h.peer("agent:researcher") as reader:
            with pytest.raises(InvalidParams):
                await agent.send("agent:w2", "tg_message", {})
            with pytest.raises(InvalidParams):
                await reader.send("agent:main", "bcp_response_delivery", {})
            with pytest.raises(InvalidParams):
                await reader.send("bcp:main:other", "bcp_response", {})
        assert len(h.rows(event="refused", status="type_denied")) == 3


async def test_only_the_gateway_may_subscribe_to_bcp(tmp_path):
    """bcp:* and any bcp topic are refused to non-gateway peers."""
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        async with h.peer("agent:main") as main, h.peer("system:gateway") as gateway:
            for pattern in ("bcp:*", "bcp:main:researcher", "*", "agent:*"):
                with pytest.raises(InvalidParams):
                    await main.subscribe(pattern)
            await gateway.subscribe("bcp:*")
        assert len(h.rows(event="refused", status="subscribe_denied")) == 4


async def test_invalid_params(tmp_path):
    """Missing fields, a '*' topic and positional params are -32602 with a readable message."""
    async with running_bus(tmp_path) as h, h.peer("tg:42") as tg:
        with pytest.raises(InvalidParams) as caught:
            await tg.request("sendMessage", {"topic": "agent:w1"})
        assert "payload" in caught.value.message
        with pytest.raises(InvalidParams):
            await tg.send("agent:*", "tg_message", {})
        with pytest.raises(InvalidParams):
            await tg.request("subscribe", ["tg:42"])
        with pytest.raises(InvalidParams):
            await tg.request("subscribe", {"topic": "tg::x"})


async def test_unsubscribe(tmp_path):
    """A peer starts subscribed to its own id; unsubscribing stops deliveries; again is -32003."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, inbox)
            assert (await tg.send("agent:w1", "tg_message", {})).delivered_to == 1
            await agent.subscribe("agent:w1")  # already subscribed: still one delivery
            await agent.unsubscribe("agent:w1")
            with pytest.raises(SubscriptionNotFound):
                await agent.unsubscribe("agent:w1")
            result = await tg.send("agent:w1", "tg_message", {})
            assert result.delivered_to == 0 and len(inbox.messages) == 1


async def test_second_connection_takes_over(tmp_path):
    """A second login as the same clientId closes the first with 4001 and logs it."""
    async with running_bus(tmp_path) as h:
        token = h.token("agent:w1")
        first = Peer(h.url, "agent:w1", token, reconnect=False)
        await first.connect()
        await first.subscribe("agent:w1")
        inbox = Inbox()
        async with Peer(h.url, "agent:w1", token) as second, h.peer("tg:42") as tg:
            second.handle(None, inbox)
            async with asyncio.timeout(scaled(5)):
                await first._ws.wait_closed()  # type: ignore[union-attr]
            assert first._ws.close_code == 4001  # type: ignore[union-attr]
            # Only the new connection gets agent:w1's messages (it is subscribed to its own id).
            assert (await tg.send("agent:w1", "tg_message", {})).delivered_to == 1
            assert len(inbox.messages) == 1
        await first.close()
        assert len(h.rows(event="replaced", actor="agent:w1")) == 1


async def test_tainted_peer_cannot_write_down(tmp_path):
    """A reader's agent_event to an untainted agent is not delivered, and is logged."""
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        inbox = Inbox()
        async with h.peer("agent:main") as main, h.peer("agent:researcher") as reader:
            main.handle(None, inbox)
            await main.subscribe("agent:main")
            result = await reader.send("agent:main", "agent_event", {"x": 1}, message_id="t-1")
            assert result.delivered_to == 0 and inbox.empty()
        [row] = h.rows(event="taint_refused", message_id="t-1")
        assert row["actor"] == "agent:main" and row["status"] == "high->none"


async def test_a_clean_sender_does_not_hear_a_tainted_target(tmp_path):
    """A controller writing to its reader's inbox is answered without waiting for the reader,
    and deliveredTo does not count it: the reader cannot choose what (or when) the controller
    reads back. The reader still gets the message, and its outcome is logged."""
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        release, seen, finished = asyncio.Event(), Inbox(), asyncio.Event()

        async def holds(message: Message) -> None:
            await seen(message)
            await release.wait()  # a reader that would time the controller's request

        def recorded(event: str, topic: str | None, status: str | None, payload: Any) -> None:
            if event == "process_finish" and topic == "agent:researcher":
                finished.set()

        h.log.on_record = recorded

        async with h.peer("agent:main") as main, h.peer("agent:researcher") as reader:
            reader.handle(None, holds)
            await reader.subscribe("agent:researcher")
            async with asyncio.timeout(scaled(5)):  # answered while the reader still holds it
                result = await main.send(
                    "agent:researcher", "agent_event", {"x": 1}, message_id="u-1"
                )
            assert result.delivered_to == 0
            assert (await seen.get()).content == {"x": 1}
            release.set()
            async with asyncio.timeout(scaled(5)):
                await finished.wait()
            await h.log.commit()
        [finish] = h.rows(event="process_finish", message_id="u-1")
        assert finish["actor"] == "agent:researcher" and finish["status"] == "processed"
        [sent] = h.rows(event="send_finish", message_id="u-1")
        assert sent["status"] == "delivered 0/0, unheard 1"


async def test_handler_may_send_while_answering(tmp_path):
    """A peer calls sendMessage from inside its processMessage handler without deadlock."""
    async with running_bus(tmp_path) as h:
        got = Inbox()
        async with h.peer("agent:w1") as w1, h.peer("agent:w2") as w2, h.peer("tg:1") as tg:

            async def relay(message: Message) -> None:
                result = await w1.send("agent:w2", "agent_event", {"relayed": message.content})
                assert result.delivered_to == 1

            w1.handle("tg_message", relay)
            w2.handle(None, got)
            await w1.subscribe("agent:w1")
            await w2.subscribe("agent:w2")
            result = await tg.send("agent:w1", "tg_message", {"n": 1})
            assert result.delivered_to == 1
            assert (await got.get()).content == {"relayed": {"n": 1}}


async def test_one_delivery_per_peer_and_not_to_the_sender(tmp_path):
    """Several matching patterns give one delivery; the sender never gets its own message."""
    async with running_bus(tmp_path) as h:
        inbox, own = Inbox(), Inbox()
        async with h.peer("agent:system") as system, h.peer("agent:w1") as w1:
            system.handle(None, inbox)
            w1.handle(None, own)
            for pattern in ("agent:system", "system:spawn", "system:route"):
                await system.subscribe(pattern)
            await w1.subscribe("agent:w1")
            assert (await w1.send("agent:system", "agent_event", {})).delivered_to == 1
            await inbox.get()
            assert inbox.empty() and own.empty()


async def test_slow_peer_does_not_stall_the_others(tmp_path):
    """A peer that never answers times out alone; the other delivery counts."""
    limits = Limits(process_timeout=0.3)
    async with running_bus(tmp_path, limits=limits) as h:
        never = asyncio.Event()

        async def stuck(message: Message) -> None:
            await never.wait()

        async with h.peer("tg:1") as a, h.peer("tg:2") as b, h.peer("agent:system") as system:
            a.handle(None, stuck)
            b.handle(None, Inbox())
            await a.subscribe("tg:1")
            await b.subscribe("tg:2")
            # agent_event is not routed to tg:*; use spawn_result, which the system sends to tg:*.
            r1 = await system.send("tg:1", "spawn_result", {}, message_id="slow")
            r2 = await system.send("tg:2", "spawn_result", {}, message_id="fast")
            assert (r1.delivered_to, r2.delivered_to) == (0, 1)
            never.set()
        [row] = h.rows(event="process_finish", message_id="slow")
        assert row["status"] == "timeout"


async def test_not_processed_is_not_counted(tmp_path):
    """A handler that answers processed: false is not counted in deliveredTo."""
    async with running_bus(tmp_path) as h:
        async with h.peer("agent:w1") as w1, h.peer("tg:1") as tg:
            w1.handle(None, Inbox(reply=Reply(False, "busy", "try later")))
            await w1.subscribe("agent:w1")
            assert (await tg.send("agent:w1", "tg_message", {}, message_id="nb")).delivered_to == 0
        [row] = h.rows(event="process_finish", message_id="nb")
        assert row["status"] == "not_processed" and "busy" in row["error"]


async def test_presence_events(tmp_path):
    """The gateway sees peer_joined and peer_left on system:presence, in order."""
    async with running_bus(tmp_path) as h, h.peer("system:gateway") as gateway:
        inbox = Inbox()
        gateway.handle(None, inbox)
        await gateway.subscribe("system:presence")
        async with h.peer("agent:w9"):
            joined = await inbox.get_type("peer_joined")
            assert joined.content["clientId"] == "agent:w9"
            assert joined.sender == "system:bus"
        left = await inbox.get_type("peer_left")
        assert left.content == {"clientId": "agent:w9", "reason": "disconnected"}


async def test_presence_content_satisfies_its_models_and_schema_files(tmp_path):
    """peer_joined and both kinds of peer_left, as published, validate as schemas/json says."""
    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        inbox = Inbox()
        async with h.peer("system:gateway") as gateway:
            gateway.handle(None, inbox)
            await gateway.subscribe("system:presence")
            token = h.token("agent:main")
            first = Peer(h.url, "agent:main", token, reconnect=False)
            await first.connect()
            async with Peer(h.url, "agent:main", token, reconnect=False):
                async with asyncio.timeout(scaled(5)):
                    await first._ws.wait_closed()  # type: ignore[union-attr]
            await first.close()
            events = [await inbox.get() for _ in range(4)]
        assert [(event.type, event.content.get("reason")) for event in events] == [
            ("peer_joined", None),
            ("peer_left", "replaced"),
            ("peer_joined", None),
            ("peer_left", "disconnected"),
        ]
        assert events[0].content == {"clientId": "agent:main", "roles": ["agent", "controller"]}
        for event in events:
            assert event.sender == BUS_CLIENT_ID and event.topic == PRESENCE_TOPIC
            Envelope.model_validate(event.payload)
            PRESENCE_MODELS[event.type].model_validate(event.content)
            assert _schema_errors(event.type, event.content) == []


async def test_subscription_limit(tmp_path):
    """One subscription over max_subscriptions is -32005 and a limit_exceeded row."""
    # The gateway's own address (system:gateway, where screeners answer) takes the first slot.
    async with running_bus(tmp_path, limits=Limits(max_subscriptions=2)) as h:
        async with h.peer("system:gateway") as gateway:
            await gateway.subscribe("bcp:*")
            await gateway.subscribe("bcp:*")  # already subscribed: no new slot used
            with pytest.raises(LimitExceeded):
                await gateway.subscribe("system:presence")
        assert h.rows(event="limit_exceeded", status="max_subscriptions")


async def test_oversized_frame_closes_with_1009(tmp_path):
    """A frame over max_frame_bytes closes the connection with 1009; before initialize it is
    counted into ws_refused."""
    async with running_bus(tmp_path, limits=Limits(max_frame_bytes=1000)) as h:
        async with connect(h.url) as ws:
            await ws.send("x" * 2000)
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(scaled(5)):
                    await ws.recv()
            assert ws.close_code == 1009
        await h.bus.close()  # its handler has counted it once it is closed
        assert await h.refused() == {"frame_too_large": 1}


async def test_anonymous_connection_limit_answers_503(tmp_path):
    """The handshake past max_anonymous_connections is refused with HTTP 503."""
    async with running_bus(tmp_path, limits=Limits(max_anonymous_connections=1)) as h:
        async with connect(h.url):
            with pytest.raises(InvalidStatus) as caught:
                async with connect(h.url):
                    pass
            assert caught.value.response.status_code == 503
            assert await h.refused() == {"max_anonymous_connections": 1}


async def test_peer_limit_refuses_initialize_with_32005_and_1013(tmp_path):
    """The initialize past max_connections peers gets -32005 and close 1013; a takeover of a
    connected clientId still works."""
    async with running_bus(tmp_path, limits=Limits(max_connections=1)) as h:
        async with h.peer("tg:1"):
            token = h.token("tg:2")
            async with connect(h.url) as ws:
                answer = await raw_call(
                    ws, "initialize", {"clientId": "tg:2", "auth": {"token": token}}
                )
                assert answer["error"]["code"] == -32005
                with pytest.raises(ConnectionClosed) as caught:
                    async with asyncio.timeout(scaled(5)):
                        await ws.recv()
                assert caught.value.rcvd is not None and caught.value.rcvd.code == 1013
            async with h.peer("tg:1") as again:  # replaces the first tg:1, not one more
                assert (await again.ping()).pong is True
            await h.log.commit()
            assert h.rows(event="limit_exceeded", status="max_connections")


async def test_initialize_timeout_closes_with_4002(tmp_path):
    """A connection that never initializes is closed with 4002."""
    async with running_bus(tmp_path, limits=Limits(initialize_timeout=0.2)) as h:
        async with connect(h.url) as ws:
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(scaled(5)):
                    await ws.recv()
            assert ws.close_code == 4002
        assert await h.refused() == {"initialize_timeout": 1}


async def test_healthz(tmp_path):
    """GET /healthz on the bus port answers 200."""
    async with running_bus(tmp_path) as h:
        url = h.url.replace("ws://", "http://") + "/healthz"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        assert body == b"ok\n"


async def test_batch_over_the_wire(tmp_path):
    """A batch of two pings and a notification is answered with one array of two."""
    async with running_bus(tmp_path) as h, h.peer("agent:w1"):
        token = h.token("agent:w2")
        async with connect(h.url) as ws:
            await raw_call(ws, "initialize", {"clientId": "agent:w2", "auth": {"token": token}})
            batch = [
                {"jsonrpc": "2.0", "id": 1, "method": "ping"},
                {"jsonrpc": "2.0", "method": "ping"},
                {"jsonrpc": "2.0", "id": 2, "method": "nope"},
            ]
            await ws.send(json.dumps(batch))
            async with asyncio.timeout(scaled(5)):
                replies = json.loads(await ws.recv())
            by_id = {reply["id"]: reply for reply in replies}
            assert by_id[1]["result"]["pong"] is True
            assert by_id[2]["error"]["code"] == -32601
            assert len(replies) == 2


async def test_internal_error_leaks_nothing(tmp_path, monkeypatch):
    """An unexpected exception in a handler is -32603 with a fixed text."""
    async with running_bus(tmp_path) as h, h.peer("agent:w1") as peer:

        async def broken(conn: Any, request: Any) -> Any:
            raise RuntimeError("secret path /etc/shadow")

        monkeypatch.setitem(h.bus._methods.table, "ping", broken)
        with pytest.raises(Exception) as caught:
            await peer.ping()
        assert caught.value.code == -32603  # type: ignore[attr-defined]
        assert "secret" not in str(caught.value)


async def test_audit_failure_fails_bcp_traffic_closed(tmp_path, monkeypatch):
    """When the log cannot commit, BCP messages are not delivered and the sender gets -32006."""
    from bus.core.errors import AuditUnavailable

    async with running_bus(tmp_path, identities=IDENTITIES) as h:
        inbox = Inbox()
        async with h.peer("agent:main") as main, h.peer("system:gateway") as gateway:
            gateway.handle(None, inbox)
            await gateway.subscribe("bcp:*")

            async def failing_commit() -> None:
                raise AuditUnavailable()

            monkeypatch.setattr(h.log, "commit", failing_commit)
            with pytest.raises(AuditUnavailable):
                await main.send("bcp:main:researcher", "bcp_query_request", {"query_id": "q"})
            assert inbox.empty()


async def test_sdk_reconnects_and_resubscribes(tmp_path):
    """When the bus drops its socket, the SDK peer logs in again and restores its subscription."""
    async with running_bus(tmp_path) as h:
        inbox, presence = Inbox(), Inbox()
        async with h.peer("system:gateway") as watcher:
            watcher.handle(None, presence)
            await watcher.subscribe("system:presence")
            async with h.peer("agent:w1") as peer, h.peer("tg:1") as tg:
                peer.handle(None, inbox)
                await peer.subscribe("agent:w1")
                await presence.get_type("peer_joined")  # agent:w1
                await presence.get_type("peer_joined")  # tg:1
                await h.bus.peers["agent:w1"].close(1011, "dropped for the test")
                assert (await presence.get_type("peer_left")).content["clientId"] == "agent:w1"
                joined = await presence.get_type("peer_joined", seconds=10)
                assert joined.content["clientId"] == "agent:w1"
                async with asyncio.timeout(scaled(5)):
                    await peer.connected.wait()
                result = await tg.send("agent:w1", "tg_message", {"again": True})
                assert result.delivered_to == 1
                assert (await inbox.get()).content == {"again": True}


async def test_credential_with_a_role_the_policy_forbids_is_refused(tmp_path):
    """A peers-file record claiming the gateway role for another id cannot log in."""
    async with running_bus(tmp_path) as h:
        token = h.token("agent:evil", roles=["gateway"])
        with pytest.raises(AuthenticationFailed) as caught:
            await Peer(h.url, "agent:evil", token, reconnect=False).connect()
        assert "policy" in caught.value.message
        [row] = h.rows(event="auth_failed", status="policy")
        assert row["actor"] == "agent:evil"


async def test_inflight_limit_makes_a_second_delivery_wait_for_the_slot(tmp_path):
    """With one delivery in flight per peer, a second is not sent until the first is answered."""
    limits = Limits(max_inflight_deliveries=1, process_timeout=scaled(10))
    async with running_bus(tmp_path, limits=limits) as h:
        release, holding, queued_arrived = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def slow(message: Message) -> None:
            if message.content.get("hold"):
                holding.set()
                await release.wait()
            else:
                queued_arrived.set()

        async with h.peer("agent:w1") as w1, h.peer("tg:1") as tg:
            w1.handle(None, slow)
            held = asyncio.create_task(tg.send("agent:w1", "tg_message", {"hold": True}))
            async with asyncio.timeout(scaled(5)):
                await holding.wait()
            second = asyncio.create_task(tg.send("agent:w1", "tg_message", {}, message_id="queued"))
            # The slot is taken: the second must not reach the peer while the first holds it
            # (a broken limit would deliver it at once; a working one never does, however slow
            # the machine).
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await queued_arrived.wait()
            release.set()
            assert (await held).delivered_to == 1
            assert (await second).delivered_to == 1
            assert queued_arrived.is_set()
        [row] = h.rows(event="process_finish", message_id="queued")
        assert row["status"] == "processed"


async def test_anonymous_error_flood_is_cut_off(tmp_path):
    """A connection that keeps failing before initialize is closed with 1008 after ten errors."""
    async with running_bus(tmp_path) as h, connect(h.url) as ws:
        for n in range(9):
            assert (await raw_call(ws, "ping", request_id=n))["error"]["code"] == -32001
        await ws.send("not json")
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(scaled(5)):
                while True:
                    await ws.recv()
        assert ws.close_code == 1008
        assert await h.refused() == {"rpc_error": 10, "anonymous_errors": 1}


async def test_traceparent_is_passed_on_and_its_trace_id_is_in_every_row(tmp_path):
    """A valid traceparent reaches the subscriber unchanged and its trace id is stored in each
    log row of the message; an invalid one (W3C forbids version ff) is -32602."""
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, inbox)
            payload = {
                "messageId": "traced",
                "type": "tg_message",
                "from": "tg:42",
                "timestamp": timestamp(),
                "content": {},
                "traceparent": traceparent,
            }
            await tg.request("sendMessage", {"topic": "agent:w1", "payload": payload})
            assert (await inbox.get()).payload["traceparent"] == traceparent
            rows = h.rows(message_id="traced")
            assert [row["event"] for row in rows] == [
                "send_start",
                "process_start",
                "process_finish",
                "send_finish",
            ]
            assert {row["trace_id"] for row in rows} == {"4bf92f3577b34da6a3ce929d0e0e4736"}
            bad = {**payload, "messageId": "bad", "traceparent": "ff" + traceparent[2:]}
            with pytest.raises(InvalidParams, match="traceparent"):
                await tg.request("sendMessage", {"topic": "agent:w1", "payload": bad})
