"""The cluster link: several bus nodes that act as one bus, over NATS.

Each ``bcpbus serve --cluster nats://HOST:PORT --node NAME`` is one node. The node a sender is
connected to decides (authorization, taint, limits, duplicates), records and delivers to its own
subscribers as a single bus does; :meth:`ClusterLink.forward` publishes the accepted message on
NATS at the same time and gathers the other nodes' answers, so ``deliveredTo`` counts every
node's subscribers. A node that receives a message from NATS checks it again against its own
policy, credentials and agent definitions before it hands it to :meth:`Bus.deliver_forwarded`:
a node never delivers what it would have refused.

NATS carries (subjects under ``bcpbus.``, JSON bodies, models below):

- ``bcpbus.msg.<topic>``: accepted messages, the topic's ``:`` turned into ``.`` and any ``.``
  in a segment escaped as ``%2E``, with a reply subject for the :class:`Answer` of each node;
- ``bcpbus.node.hello``: each node says it is alive every :data:`HEARTBEAT` seconds (and
  ``bye`` when it closes), so a sender knows whose answers to wait for;
- ``bcpbus.node.reload``: a node reloaded on SIGHUP asks the others to read their files again;
- the JetStream key-value bucket :data:`PRESENCE_BUCKET`: which node each clientId is connected
  to. The later registration (the higher revision) wins: the node holding the older link closes
  it with 4001, as a takeover on one node does.

NATS is the one messaging engine between nodes, not a protocol of our own: it keeps the
order of each node's messages, reconnects after a restart, and its key-value store orders
registrations. A node cut off from NATS refuses ``sendMessage`` with -32011
(:class:`~bus.core.errors.ClusterUnavailable`) instead of delivering to part of the bus.

Epochs stay those of each node's log (monotonic per node: :mod:`bus.core.epochs`); a node that
delivers a forwarded message first moves its clock past the sender node's epoch, so across nodes
an effect's epoch is above its cause's (a hybrid logical clock). Ties across nodes are broken by
node name where logs are merged (:mod:`bus.log.merged`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.bus import ListPeersResult, PeerInfo

from ..core.errors import BusError, ClusterUnavailable
from ..core.identities import PeerIdentity
from ..core.logevents import LogEvent
from ..core.policy import Grants, Policy, PolicyError
from ..core.presence import BUS_CLIENT_ID, PRESENCE_TOPIC
from ..core.router import Route
from ..log.activity import ActivityLog
from ..log.fetch import sender_mark
from ..ops.config import Limits
from ..ops.credentials import Credentials
from ..ops.startup import StartupError

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.js.kv import KeyValue

__all__ = [
    "HEARTBEAT",
    "PRESENCE_BUCKET",
    "Accepted",
    "Answer",
    "ClusterLink",
    "Forwarded",
    "Forwarder",
    "Hello",
    "Node",
    "Reload",
    "joined",
    "presence_key",
    "subject_for",
]

logger = logging.getLogger("bus.transports.cluster")

SUBJECT_PREFIX = "bcpbus.msg"
HELLO_SUBJECT = "bcpbus.node.hello"
PEERS_SUBJECT = "bcpbus.node.peers"
RELOAD_SUBJECT = "bcpbus.node.reload"
PRESENCE_BUCKET = "bcpbus-presence"
HEARTBEAT = 1.0
"""Seconds between two hellos of a node."""
NODE_TTL = 3.5 * HEARTBEAT
"""A node not heard from for this long is gone: senders stop waiting for its answers."""
CONNECT_TIMEOUT = 5
"""Seconds a node waits for NATS at start before it gives up (later, it reconnects forever)."""
ANSWER_GRACE = 1.0
"""Seconds a sender waits for other nodes' answers beyond ``process_timeout``."""


class Accepted(Protocol):
    """What :meth:`Forwarder.forward` reads of a message the bus accepted."""

    topic: str
    payload: dict[str, Any]
    message_id: str
    type: str
    epoch: int
    trace_id: str | None


class Node(Protocol):
    """What the cluster link needs of the bus it joins (:class:`bus.server.Bus`)."""

    log: ActivityLog
    limits: Limits
    credentials: Credentials
    policy: Policy
    identities: dict[str, PeerIdentity]
    cluster: Forwarder | None

    @property
    def peers(self) -> Mapping[str, Any]: ...

    async def deliver_forwarded(
        self,
        topic: str,
        payload: dict[str, Any],
        message_id: str,
        message_type: str,
        *,
        sender: Route[Any] | None,
        epoch: int,
        trace_id: str | None = None,
    ) -> tuple[int, int]: ...

    def replaced_elsewhere(self, client_id: str, node: str) -> bool: ...

    def local_peers(self) -> ListPeersResult: ...


class Trigger(Protocol):
    """What a node's reloads need of its :class:`bus.ops.reload.Reloader`."""

    def trigger(self) -> None: ...


class Forwarder(Protocol):
    """What the bus asks of the other nodes (:attr:`bus.server.Bus.cluster`)."""

    def check(self) -> None:
        """Raise :class:`ClusterUnavailable` when the other nodes cannot be reached."""

    def joined(self, client_id: str) -> None:
        """Tell the other nodes that ``client_id`` logged in here (they close older links)."""

    async def forward(self, message: Accepted, sender: str) -> tuple[int, int]:
        """Deliver ``message`` on the other nodes; return (processed, tried) over them."""

    async def list_peers(self, local: ListPeersResult) -> ListPeersResult:
        """``local`` with the peers of every other node that answers."""


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class Forwarded(_Wire):
    """A message one node accepted, as the other nodes receive it."""

    node: str
    topic: str
    payload: dict[str, Any]
    message_id: str = Field(alias="messageId")
    type: str
    epoch: int
    trace_id: str | None = Field(default=None, alias="traceId")
    sender: str
    """The sender's clientId; ``system:bus`` for the bus's own messages (presence)."""
    mark: str
    """The sender's taint as the accepting node saw it (``send_start``'s status)."""


class Answer(_Wire):
    """One node's outcome of a :class:`Forwarded`: how many of its subscribers processed it."""

    node: str
    delivered: int
    targets: int


class PeerList(_Wire):
    """One node's answer to a cluster-wide ``listPeers``."""

    node: str
    peers: list[PeerInfo]


class Reload(_Wire):
    """A node asking the others to read their peers file, policy and agents again (SIGHUP)."""

    node: str


class Hello(_Wire):
    """A node saying it is alive (or, with ``bye``, that it is leaving)."""

    node: str
    bye: bool = False


def subject_for(topic: str) -> str:
    """The NATS subject of a bus topic: ``bcp:main:r`` -> ``bcpbus.msg.bcp.main.r``."""
    return ".".join([SUBJECT_PREFIX, *(s.replace(".", "%2E") for s in topic.split(":"))])


def presence_key(client_id: str) -> str:
    """The key-value key of a clientId (keys allow no ``:``): base64url, no padding."""
    return base64.urlsafe_b64encode(client_id.encode()).decode().rstrip("=")


def _encode(model: _Wire) -> bytes:
    return model.model_dump_json(by_alias=True).encode()


@dataclass
class _Gather:
    """The answers one forwarded message is waiting for."""

    expected: set[str]
    answers: dict[str, Answer] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, answer: Answer) -> None:
        self.answers[answer.node] = answer
        self.arrived.set()

    def complete(self, live: set[str]) -> bool:
        """Whether every node expected and still alive has answered."""
        return self.expected & live <= self.answers.keys()


class ClusterLink:
    """This bus's link to the other nodes of its cluster; use it as an async context manager.

    Args:
        bus: the started bus of this node; the link sets ``bus.cluster`` while it runs.
        url: the NATS server, ``nats://HOST:PORT``.
        node: this node's name, unique in the cluster.
    """

    def __init__(self, bus: Node, url: str, *, node: str) -> None:
        self.bus = bus
        self.url = url
        self.node = node
        self._nc: NATS | None = None
        self._nodes: dict[str, float] = {}
        self._node_joined = asyncio.Event()
        self._waiting: dict[str, _Gather] = {}
        self._inbox = ""
        self._counter = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._registry: _Registry | None = None
        self._closing = False
        self._reloader: Trigger | None = None

    # Lifecycle

    async def __aenter__(self) -> ClusterLink:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect to NATS, join the cluster and set ``bus.cluster``.

        Raises:
            ConnectionError: NATS cannot be reached at :attr:`url` (or has no JetStream).
        """
        from nats.aio.client import Client  # the cluster extra: imported on use

        self._nc = nc = Client()
        try:
            # The first connection is bounded here: nats-py would retry it forever, as it
            # does every later reconnect (which is what a node wants once it has joined).
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await nc.connect(
                    self.url,
                    name=f"bcpbus {self.node}",
                    no_echo=True,  # a node's own messages never come back to it
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    connect_timeout=CONNECT_TIMEOUT,
                    disconnected_cb=self._disconnected,
                    reconnected_cb=self._reconnected,
                    error_cb=self._error,
                )
        except Exception as exc:
            await self._drop()
            why = "no answer" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            raise ConnectionError(f"--cluster {self.url}: NATS cannot be reached: {why}") from exc
        try:
            kv = await nc.jetstream().create_key_value(bucket=PRESENCE_BUCKET, history=1)
        except Exception as exc:
            await self._drop()
            raise ConnectionError(
                f"--cluster {self.url}: NATS answers but its key-value store does not ({exc!r}): "
                "start nats-server with JetStream on (-js)"
            ) from exc
        self._inbox = nc.new_inbox()
        await nc.subscribe(f"{SUBJECT_PREFIX}.>", cb=self._on_message)
        await nc.subscribe(f"{self._inbox}.*", cb=self._on_answer)
        await nc.subscribe(HELLO_SUBJECT, cb=self._on_hello)
        await nc.subscribe(PEERS_SUBJECT, cb=self._on_peers)
        await nc.subscribe(RELOAD_SUBJECT, cb=self._on_reload)
        await self._hello()
        self._spawn(self._heartbeat())
        self._registry = _Registry(self.bus, self.node, kv, self._spawn)
        self._spawn(self._registry.watch())
        self.bus.cluster = self
        self.bus.log.record(
            LogEvent.CLUSTER_NODE, actor=self.node, status="started", topic=self.url
        )
        logger.info("node %s joined the cluster at %s", self.node, self.url)

    async def close(self) -> None:
        """Leave the cluster: say bye, stop the tasks, close the NATS link. Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self.bus.cluster is self:
            self.bus.cluster = None
        nc = self._nc
        if nc is not None and nc.is_connected:
            with contextlib.suppress(Exception):
                await nc.publish(HELLO_SUBJECT, _encode(Hello(node=self.node, bye=True)))
                if self._registry is not None:
                    await self._registry.leave_all()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        await self._drop()

    async def _drop(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # Membership

    def live_nodes(self) -> set[str]:
        """The other nodes heard from in the last :data:`NODE_TTL` seconds."""
        now = time.monotonic()
        return {node for node, seen in self._nodes.items() if now - seen < NODE_TTL}

    async def wait_for_node(self, node: str) -> None:
        """Return once ``node`` is alive in this node's view; wrap it in a timeout."""
        while node not in self.live_nodes():
            self._node_joined.clear()
            await self._node_joined.wait()

    async def _hello(self) -> None:
        assert self._nc is not None
        await self._nc.publish(HELLO_SUBJECT, _encode(Hello(node=self.node)))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            if self._nc is not None and self._nc.is_connected:
                with contextlib.suppress(Exception):
                    await self._hello()

    async def _on_hello(self, msg: Msg) -> None:
        try:
            hello = Hello.model_validate_json(msg.data)
        except ValidationError:
            return
        if hello.bye:
            self._nodes.pop(hello.node, None)
            self.bus.log.record(LogEvent.CLUSTER_NODE, actor=hello.node, status="left")
            return
        if hello.node not in self._nodes:
            self.bus.log.record(LogEvent.CLUSTER_NODE, actor=hello.node, status="joined")
            logger.info("node %s is in the cluster", hello.node)
            await self._hello()  # so that it knows this node at once too
        self._nodes[hello.node] = time.monotonic()
        self._node_joined.set()

    async def _disconnected(self) -> None:
        if not self._closing:
            logger.warning("node %s is cut off from NATS: sends are refused (-32011)", self.node)
            self.bus.log.record(LogEvent.CLUSTER_NODE, actor=self.node, status="cut_off")

    async def _reconnected(self) -> None:
        logger.info("node %s reached NATS again", self.node)
        self.bus.log.record(LogEvent.CLUSTER_NODE, actor=self.node, status="reconnected")
        if self._registry is not None:
            self._spawn(self._registry.heal())

    async def _error(self, exc: Exception) -> None:
        logger.debug("NATS: %r", exc)

    # Sending

    def check(self) -> None:
        """Raise :class:`ClusterUnavailable` while NATS cannot be reached."""
        if self._nc is None or not self._nc.is_connected:
            raise ClusterUnavailable()

    async def forward(self, message: Accepted, sender: str) -> tuple[int, int]:
        """Publish ``message`` to the other nodes and wait for the answers of those alive.

        Never raises: a node that does not answer in time counts for nothing, and a message
        forwarded while cut off (only the bus's own, as sends are refused) stays on this node.

        Returns:
            How many subscribers on other nodes processed it, and how many were tried.
        """
        nc = self._nc
        if nc is None or not nc.is_connected:
            return 0, 0
        if message.topic == PRESENCE_TOPIC and sender == BUS_CLIENT_ID:
            if self._registry is not None:
                await self._registry.left(message)
        self._counter += 1
        token = str(self._counter)
        gather = self._waiting[token] = _Gather(self.live_nodes())
        forwarded = Forwarded(
            node=self.node,
            topic=message.topic,
            payload=message.payload,
            message_id=message.message_id,
            type=message.type,
            epoch=message.epoch,
            trace_id=message.trace_id,
            sender=sender,
            mark=self._mark(sender),
        )
        try:
            await nc.publish(
                subject_for(message.topic), _encode(forwarded), reply=f"{self._inbox}.{token}"
            )
            await self._wait(gather)
        except Exception as exc:  # a link lost mid-publish: what answered is what counts
            logger.warning("forwarding %s failed: %r", message.message_id, exc)
        finally:
            self._waiting.pop(token, None)
        answers = dict(gather.answers)
        self.bus.log.record(
            LogEvent.CLUSTER_OUT,
            message_id=message.message_id,
            actor=sender,
            topic=message.topic,
            status=f"{len(answers)}/{len(gather.expected)} nodes answered",
            payload={n: [a.delivered, a.targets] for n, a in sorted(answers.items())},
            epoch=message.epoch,
        )
        return sum(a.delivered for a in answers.values()), sum(a.targets for a in answers.values())

    async def _wait(self, gather: _Gather) -> None:
        """Wait until every expected node has answered, has gone silent (killed: it is
        waited for :data:`NODE_TTL` at most), or ``process_timeout`` has passed."""
        process = self.bus.limits.process_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (process if process is not None else 30.0) + ANSWER_GRACE
        while not gather.complete(self.live_nodes()):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            gather.arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(HEARTBEAT, remaining)):
                    await gather.arrived.wait()

    def _mark(self, sender: str) -> str:
        if sender == BUS_CLIENT_ID:
            return sender_mark(None)
        return sender_mark(_grants(self.bus, sender))

    async def _on_answer(self, msg: Msg) -> None:
        gather = self._waiting.get(msg.subject.rsplit(".", 1)[-1])
        if gather is None:
            return  # too late: the sender was answered without it
        with contextlib.suppress(ValidationError):
            gather.add(Answer.model_validate_json(msg.data))

    # Receiving

    async def _on_message(self, msg: Msg) -> None:
        # NATS calls back one message at a time per subscription: deliver each in a task of
        # its own, so one slow subscriber never holds up the next message.
        self._spawn(self._receive(msg))

    async def _receive(self, msg: Msg) -> None:
        delivered = targets = 0
        node = "?"
        try:
            forwarded = Forwarded.model_validate_json(msg.data)
            node = forwarded.node
            sender = self._sender_route(forwarded)
            self.bus.log.record(
                LogEvent.CLUSTER_IN,
                message_id=forwarded.message_id,
                actor=forwarded.sender,
                topic=forwarded.topic,
                status=forwarded.node,
                payload={"node": forwarded.node, "epoch": forwarded.epoch},
            )
            delivered, targets = await self.bus.deliver_forwarded(
                forwarded.topic,
                forwarded.payload,
                forwarded.message_id,
                forwarded.type,
                sender=sender,
                epoch=forwarded.epoch,
                trace_id=forwarded.trace_id,
            )
        except _Refused as refusal:
            self._refused(forwarded, refusal.reason)
        except ValidationError:
            logger.warning("a malformed message on %s was dropped", msg.subject)
        except BusError as exc:  # this node's log failed, or it is closing: nothing delivered
            logger.warning("a message from %s was not delivered here: %s", node, exc)
        if msg.reply and self._nc is not None:
            answer = Answer(node=self.node, delivered=delivered, targets=targets)
            with contextlib.suppress(Exception):
                await self._nc.publish(msg.reply, _encode(answer))

    def _sender_route(self, forwarded: Forwarded) -> Route[Any] | None:
        """The route ``forwarded``'s sender acts through here (None for the bus itself).

        Raises:
            _Refused: this node's own policy, credentials or agent definitions refuse it.
        """
        sender, topic = forwarded.sender, forwarded.topic
        if sender == BUS_CLIENT_ID:
            if topic != PRESENCE_TOPIC:
                raise _Refused("cluster_bus_topic")
            return None
        grants = _grants(self.bus, sender)
        if grants is None:
            raise _Refused("cluster_unknown_sender")
        if not grants.may_send(forwarded.type, topic):
            raise _Refused("type_denied")
        if sender_mark(grants) != forwarded.mark:
            # The nodes disagree on the sender's taint: their agent definitions differ.
            raise _Refused("cluster_taint_differs")
        return Route(_Remote(sender, forwarded.node), sender, grants)

    def _refused(self, forwarded: Forwarded, reason: str) -> None:
        self.bus.log.record(
            LogEvent.REFUSED,
            message_id=forwarded.message_id,
            actor=forwarded.sender,
            topic=forwarded.topic,
            status=reason,
            payload={"node": forwarded.node, "epoch": forwarded.epoch},
        )
        logger.warning("refused a message from node %s: %s", forwarded.node, reason)

    # listPeers across nodes

    async def list_peers(self, local: ListPeersResult) -> ListPeersResult:
        """``local`` and the peers of every other node alive that answers within
        :data:`HEARTBEAT`, sorted by clientId; another node's address starts with its name."""
        nc = self._nc
        if nc is None or not nc.is_connected:
            return local
        return await _gather_peers(nc, len(self.live_nodes()), local)

    async def _on_peers(self, msg: Msg) -> None:
        if msg.reply:
            answer = PeerList(node=self.node, peers=self.bus.local_peers().peers)
            with contextlib.suppress(Exception):
                await msg.respond(_encode(answer))

    # Reloads across nodes

    def follow(self, reloader: Trigger) -> None:
        """Reload with the other nodes: :meth:`reload_everywhere` here reloads them too, and a
        reload asked on another node triggers ``reloader`` (:class:`bus.ops.reload.Reloader`)."""
        self._reloader = reloader

    def reload_everywhere(self) -> None:
        """Reload this node now and ask every other node to read its own files again: give it
        to SIGHUP in place of the reloader's ``trigger``. A changed file needs no such call:
        every node reading it sees the change by itself."""
        if self._reloader is not None:
            self._reloader.trigger()
        if self._nc is not None and self._nc.is_connected:
            self._spawn(self._nc.publish(RELOAD_SUBJECT, _encode(Reload(node=self.node))))

    async def _on_reload(self, msg: Msg) -> None:
        try:
            reload = Reload.model_validate_json(msg.data)
        except ValidationError:
            return
        if reload.node != self.node and self._reloader is not None:
            logger.info("node %s asked for a reload", reload.node)
            self.bus.log.record(LogEvent.CLUSTER_NODE, actor=reload.node, status="reload")
            self._reloader.trigger()

    # Presence: one link per clientId in the cluster

    def joined(self, client_id: str) -> None:
        """Register ``client_id``'s new link here, at once (see :class:`_Registry`)."""
        if self._registry is not None and self._nc is not None and self._nc.is_connected:
            self._registry.joined(client_id)


async def _gather_peers(nc: NATS, nodes: int, local: ListPeersResult) -> ListPeersResult:
    """Ask every node for its peers; add the answers of the first ``nodes`` to ``local``."""
    answers: asyncio.Queue[bytes] = asyncio.Queue()

    async def arrived(msg: Msg) -> None:
        answers.put_nowait(msg.data)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=arrived)
    peers = list(local.peers)
    try:
        await nc.publish(PEERS_SUBJECT, b"", reply=inbox)
        async with asyncio.timeout(HEARTBEAT):
            for _ in range(nodes):
                answer = PeerList.model_validate_json(await answers.get())
                peers += [
                    p.model_copy(update={"address": f"{answer.node} {p.address}"})
                    for p in answer.peers
                ]
    except (TimeoutError, ValidationError):
        pass  # what answered is what is listed
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return ListPeersResult(peers=sorted(peers, key=lambda p: p.client_id))


def _grants(bus: Node, client_id: str) -> Grants | None:
    """The grants ``bus``'s policy gives ``client_id``; None if it has no credential there or
    the policy refuses its roles."""
    record = bus.credentials.record(client_id)
    if record is None:
        return None
    identity = bus.identities.get(client_id)
    extra: Iterable[str] = identity.roles if identity is not None else ()
    try:
        roles = bus.policy.roles_for(client_id, (*record.roles, *extra))
        taint = identity.taint if identity is not None else None
        return bus.policy.grants(client_id, roles, taint=taint)
    except (PolicyError, ValueError):
        return None


class _Registry:
    """One link per clientId in the cluster, kept in the key-value bucket
    :data:`PRESENCE_BUCKET`: each login registers at once, and the later registration (the
    higher revision) wins: the node holding the older link closes it with 4001."""

    def __init__(self, bus: Node, node: str, kv: KeyValue, spawn: Callable[[Any], None]) -> None:
        self.bus, self.node, self._kv, self._spawn = bus, node, kv, spawn
        self._mine: dict[str, int] = {}
        """clientId -> the revision of its link's registration on this node."""

    def joined(self, client_id: str) -> None:
        """Register ``client_id``'s new link here: a login on another node before this one is
        then closed, and one after it closes this one."""
        self._mine.pop(client_id, None)
        self._spawn(self._register(client_id))

    async def left(self, message: Accepted) -> None:
        """Drop the registration of a peer that left (and has not come back meanwhile)."""
        client_id = message.payload.get("content", {}).get("clientId")
        if message.type != "peer_left" or client_id in self.bus.peers:
            return
        revision = self._mine.pop(client_id, None) if isinstance(client_id, str) else None
        if revision is not None:
            await self._unregister(client_id, revision)

    async def leave_all(self) -> None:
        """Drop every registration of this node (it is closing)."""
        for client_id, revision in list(self._mine.items()):
            await self._unregister(client_id, revision)

    async def _register(self, client_id: str) -> None:
        value = json.dumps({"node": self.node, "clientId": client_id}).encode()
        with contextlib.suppress(Exception):  # cut off meanwhile: heal() registers it again
            self._mine[client_id] = await self._kv.put(presence_key(client_id), value)

    async def _unregister(self, client_id: str, revision: int) -> None:
        with contextlib.suppress(Exception):  # someone registered since: theirs stays
            await self._kv.delete(presence_key(client_id), last=revision)

    async def watch(self) -> None:
        """Close the link of a peer here when a later registration puts it on another node."""
        watcher = await self._kv.watchall()
        async for entry in watcher:
            if entry is None or entry.value is None or entry.operation is not None:
                continue  # the end of the initial values, or a deletion
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(entry.value)
                self._seen_elsewhere(record["clientId"], record["node"], entry.revision)

    def _seen_elsewhere(self, client_id: str, node: str, revision: int) -> None:
        if node == self.node or client_id not in self.bus.peers:
            return
        mine = self._mine.get(client_id)
        if mine is None or mine > revision:
            return  # not registered here yet (ours will be later), or ours is the newer
        self._mine.pop(client_id, None)
        self.bus.replaced_elsewhere(client_id, node)

    async def heal(self) -> None:
        """After NATS comes back: register again the peers still here, unless a later
        registration put them on another node meanwhile (then this link is the older)."""
        for client_id in list(self.bus.peers):
            try:
                entry = await self._kv.get(presence_key(client_id))
                record = json.loads(entry.value or b"{}")
            except Exception:
                record = {}
            if record.get("node") not in (None, self.node):
                self._mine.pop(client_id, None)
                self.bus.replaced_elsewhere(client_id, record["node"])
            else:
                await self._register(client_id)


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Remote:
    """The link of a sender connected to another node: the bus never delivers to it."""

    inflight: asyncio.Semaphore | None = None

    def __init__(self, client_id: str, node: str) -> None:
        self.name = f"{client_id}@{node}"

    def write_buffer_size(self) -> int:
        return 0

    async def call(self, method: str, params: Any) -> Any:
        raise BusError(f"{self.name} is on another node")

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)

    async def close(self, code: int, reason: str) -> None:
        return None


@contextlib.asynccontextmanager
async def joined(bus: Node, url: str, node: str | None = None) -> AsyncIterator[ClusterLink]:
    """Make ``bus`` a node of the cluster at ``url`` (``serve --cluster``) while in the block.

    Args:
        node: this node's name; None for the host name.

    Raises:
        StartupError: the ``cluster`` extra is missing, or NATS cannot be reached; one line.
    """
    try:
        import nats  # noqa: F401 - the cluster extra is optional: checked on use
    except ImportError:
        raise StartupError(
            "--cluster needs the cluster extra (nats-py is missing): pip install 'bcpbus[cluster]'"
        ) from None
    link = ClusterLink(bus, url, node=node or socket.gethostname())
    try:
        await link.start()
    except ConnectionError as exc:
        raise StartupError(str(exc)) from None
    try:
        yield link
    finally:
        await link.close()
