"""The cluster link: several bus nodes that act as one bus, over NATS.

Each ``bcpbus serve --cluster nats://HOST:PORT --node NAME`` is one node. The node a sender is
connected to decides (authorization, taint, limits, duplicates) as a single bus does, then
:meth:`ClusterLink.sequence` stores the message in the cluster's JetStream stream; every node,
the sending one included, accepts it (its epoch, its rows) when its ordered reading of the
stream reaches it, and delivers it to its own subscribers; :meth:`ClusterLink.forward` gathers
the other nodes' answers, so ``deliveredTo`` counts every node's subscribers. A node that
reads another node's message checks it again against its own policy, credentials and agent
definitions before it hands it to :meth:`Bus.deliver_forwarded`: a node never delivers what it
would have refused.

NATS carries (subjects under ``bcpbus.``, JSON bodies: :mod:`.cluster_wire`):

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

Epochs come from the stream (:mod:`.cluster_history`, :mod:`bus.core.epochs`): the message at
stream sequence ``seq`` has the epoch ``base + seq * STREAM_STEP`` in every node's log, so a
peer's cursor read on one node is exact on another, and each node's epochs strictly increase.

The parts beside this module: :mod:`.cluster_wire` (subjects and bodies), :mod:`.cluster_node`
(what the link and the bus ask of each other), :mod:`.cluster_members` (who is alive),
:mod:`.cluster_inbound` (receiving: the re-check and the delivery), :mod:`.cluster_registry`
(one link per clientId).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from schemas.bus import ListPeersResult

from ..core.errors import ClusterUnavailable
from ..core.logevents import LogEvent
from ..core.presence import BUS_CLIENT_ID, PRESENCE_TOPIC
from ..log.fetch import sender_mark
from ..ops.startup import StartupError
from .cluster_history import PUBLISH_TIMEOUT
from .cluster_inbound import Inbound
from .cluster_members import Nodes, Reloads
from .cluster_node import Accepted, Forwarder, Node, T, Trigger, grants_of
from .cluster_order import Order, StreamAhead
from .cluster_registry import Registry
from .cluster_wire import (
    HEARTBEAT,
    HELLO_SUBJECT,
    PEERS_SUBJECT,
    PRESENCE_BUCKET,
    RELOAD_SUBJECT,
    Answer,
    Forwarded,
    Hello,
    PeerList,
    Reload,
    encode,
    presence_key,
    subject_for,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext
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

CONNECT_TIMEOUT = 5
"""Seconds a node waits for NATS at start before it gives up (later, it reconnects forever)."""
HEAL_ATTEMPTS = 30
"""Times a node tries, a second apart, to make NATS's stores again after a reconnect."""
ANSWER_GRACE = 1.0
"""Seconds a sender waits for other nodes' answers beyond ``process_timeout``."""


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

    async def wait(self, live: Callable[[], set[str]], seconds: float) -> None:
        """Wait until every expected node has answered, has gone silent (killed: it is waited
        for :data:`NODE_TTL` at most, as ``live()`` drops it), or ``seconds`` have passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.complete(live()):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(HEARTBEAT, remaining)):
                    await self.arrived.wait()


class ClusterLink:
    """This bus's link to the other nodes of its cluster; use it as an async context manager.

    Args:
        bus: the started bus of this node; the link sets ``bus.cluster`` while it runs.
        url: the NATS server, ``nats://HOST:PORT``; or several servers of one NATS cluster,
            comma-separated: the node connects to one and reconnects to another.
        node: this node's name, unique in the cluster.
    """

    def __init__(self, bus: Node, url: str, *, node: str) -> None:
        self.bus = bus
        self.url = url
        self.node = node
        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._members = Nodes(bus.log, node, self._publish)
        self._waiting: dict[str, _Gather] = {}
        self._sequenced: dict[int, tuple[str, _Gather]] = {}
        """The gatherings of this node's messages stored in the stream, by epoch."""
        self._inbox = ""
        self._counter = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._registry: Registry | None = None
        self._watching: asyncio.Task[Any] | None = None
        self._closing = False
        self._reloads = Reloads(bus.log, node, self._publish)
        self._inbound = Inbound(bus, node, self._publish, self._spawn)
        self._order = Order(bus, node, self._inbound.take)

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
        nc = await self._connect()
        try:
            kv = await nc.jetstream().create_key_value(bucket=PRESENCE_BUCKET, history=1)
        except Exception as exc:
            await self._drop()
            raise ConnectionError(
                f"--cluster {self.url}: NATS answers but its key-value store does not ({exc!r}): "
                "start nats-server with JetStream on (-js)"
            ) from exc
        self._inbox = nc.new_inbox()
        await nc.subscribe(f"{self._inbox}.*", cb=self._on_answer)
        try:
            self._js = nc.jetstream(timeout=PUBLISH_TIMEOUT)
            await self._order.open(self._js)
        except Exception as exc:
            await self._drop()
            raise ConnectionError(
                f"--cluster {self.url}: JetStream refused the message history ({exc!r})"
            ) from exc
        await nc.subscribe(HELLO_SUBJECT, cb=self._members.on_hello)
        await nc.subscribe(PEERS_SUBJECT, cb=self._on_peers)
        await nc.subscribe(RELOAD_SUBJECT, cb=self._reloads.on_reload)
        await self._members.hello()
        self._spawn(self._members.heartbeat(lambda: nc.is_connected))
        self._watch_logins(kv)
        self.bus.cluster = self
        self.bus.log.record(
            LogEvent.CLUSTER_NODE, actor=self.node, status="started", topic=self.url
        )
        logger.info("node %s joined the cluster at %s", self.node, self.url)

    async def _connect(self) -> NATS:
        from nats.aio.client import Client  # the cluster extra: imported on use

        self._nc = nc = Client()
        try:
            await _connect(nc, self.url, self.node, self._disconnected, self._reconnected)
        except Exception as exc:
            await self._drop()
            why = "no answer" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            raise ConnectionError(f"--cluster {self.url}: NATS cannot be reached: {why}") from exc
        return nc

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
                await nc.publish(HELLO_SUBJECT, encode(Hello(node=self.node, bye=True)))
                if self._registry is not None:
                    await self._registry.leave_all()
        await self._order.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        await self._drop()

    async def _drop(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _watch_logins(self, kv: KeyValue) -> None:
        """Register logins in ``kv`` from now on, and watch it (in place of an earlier one)."""
        if self._watching is not None:
            self._watching.cancel()
        self._registry = Registry(self.bus, self.node, kv, self._spawn)
        self._watching = self._spawn(self._registry.watch())

    # Membership

    def live_nodes(self) -> set[str]:
        """The other nodes heard from in the last :data:`NODE_TTL` seconds."""
        return self._members.live()

    async def wait_for_node(self, node: str) -> None:
        """Return once ``node`` is alive in this node's view; wrap it in a timeout."""
        await self._members.wait_for(node)

    async def _disconnected(self) -> None:
        self._order.reading = False  # sends are refused until the reading is back (_heal)
        if not self._closing:
            logger.warning("node %s is cut off from NATS: sends are refused (-32011)", self.node)
            self.bus.log.record(LogEvent.CLUSTER_NODE, actor=self.node, status="cut_off")

    async def _reconnected(self) -> None:
        logger.info("node %s reached NATS again", self.node)
        self.bus.log.record(LogEvent.CLUSTER_NODE, actor=self.node, status="reconnected")
        self._spawn(self._heal())

    async def _heal(self) -> None:
        """After NATS comes back: make the stores again if it lost them, then register the
        peers still here again."""
        for _ in range(HEAL_ATTEMPTS):
            try:
                await self._heal_stores()
                break
            except StreamAhead as exc:
                logger.error("node %s takes no sends: %s", self.node, exc)
                self.bus.log.record(
                    LogEvent.CLUSTER_NODE, actor=self.node, status="epochs_ahead", error=str(exc)
                )
                return
            except Exception as exc:  # JetStream may need a moment after the server's restart
                logger.debug("node %s: the stores are not back yet: %r", self.node, exc)
                await asyncio.sleep(HEARTBEAT)
        if self._registry is not None:
            await self._registry.heal()

    async def _heal_stores(self) -> None:
        """Read the stream on from this node's place; make the stream and the presence bucket
        again if the NATS server came back without its store (what was in them is gone: say
        so)."""
        js = self._js
        if js is None or not await self._order.heal(js):
            return
        self._watch_logins(await js.create_key_value(bucket=PRESENCE_BUCKET, history=1))
        logger.warning("node %s: NATS lost the history's stream: made again", self.node)
        self.bus.log.record(LogEvent.CLUSTER_NODE, actor=self.node, status="stream_lost")

    # Sending

    def check(self) -> None:
        """Raise :class:`ClusterUnavailable` while NATS cannot be reached."""
        if self._nc is None or not self._nc.is_connected or not self._order.reading:
            raise ClusterUnavailable()

    async def sequence(self, message: Accepted, sender: str, stamp: Callable[[int], T]) -> T:
        """Store ``message`` in the cluster's stream, and return ``stamp(epoch)`` once this
        node reads it back there, in the stream's order; :meth:`forward` then gathers the
        answers of the other nodes (which read it at the same time).

        Raises:
            ClusterUnavailable: this node is cut off, or JetStream did not store it in time
                (:meth:`bus.transports.cluster_order.Order.store`); ``stamp`` was not called.
        """
        js = self._js
        self.check()
        assert js is not None
        if message.topic == PRESENCE_TOPIC and sender == BUS_CLIENT_ID:
            if self._registry is not None:
                await self._registry.left(message)
        self._counter += 1
        token = str(self._counter)
        gather = self._waiting[token] = _Gather(self.live_nodes())
        forwarded = _forwarded(self.bus, self.node, message, sender, f"{self._inbox}.{token}")
        try:
            result = await self._order.store(js, forwarded, token, stamp)
        except BaseException:
            self._waiting.pop(token, None)
            raise
        self._sequenced[message.epoch] = (token, gather)
        return result

    def forget(self, message: Accepted) -> None:
        """Await no answers for ``message``: its rows here failed, it is not delivered."""
        token, _ = self._sequenced.pop(message.epoch, ("", None))
        self._waiting.pop(token, None)

    async def forward(self, message: Accepted, sender: str) -> tuple[int, int]:
        """Wait for the other nodes' answers to ``message`` (stored by :meth:`sequence`), those
        of the nodes alive when it was sent.

        Never raises: a node that does not answer in time counts for nothing, and a message
        accepted while cut off (only the bus's own, as sends are refused) stays on this node.

        Returns:
            How many subscribers on other nodes processed it, and how many were tried.
        """
        token, gather = self._sequenced.pop(message.epoch, ("", None))
        if gather is None:
            return 0, 0  # not in the stream: the bus's own, while this node was cut off
        try:
            await gather.wait(self.live_nodes, self._answer_timeout())
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

    def _answer_timeout(self) -> float:
        """Seconds a sender waits for the other nodes: ``process_timeout`` and a grace."""
        process = self.bus.limits.process_timeout
        return (process if process is not None else 30.0) + ANSWER_GRACE

    async def _on_answer(self, msg: Msg) -> None:
        gather = self._waiting.get(msg.subject.rsplit(".", 1)[-1])
        if gather is None:
            return  # too late: the sender was answered without it
        with contextlib.suppress(ValidationError):
            gather.add(Answer.model_validate_json(msg.data))

    async def _publish(self, subject: str, body: bytes) -> None:
        if self._nc is not None:
            await self._nc.publish(subject, body)

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
                await msg.respond(encode(answer))

    # Reloads across nodes

    def follow(self, reloader: Trigger) -> None:
        """Reload with the other nodes: :meth:`reload_everywhere` here reloads them too, and a
        reload asked on another node triggers ``reloader`` (:class:`bus.ops.reload.Reloader`)."""
        self._reloads.reloader = reloader

    def reload_everywhere(self) -> None:
        """Reload this node now and ask every other node to read its own files again: give it
        to SIGHUP in place of the reloader's ``trigger``. A changed file needs no such call:
        every node reading it sees the change by itself."""
        if self._reloads.reloader is not None:
            self._reloads.reloader.trigger()
        if self._nc is not None and self._nc.is_connected:
            self._spawn(self._reloads.ask_others())

    # Presence: one link per clientId in the cluster

    def joined(self, client_id: str) -> None:
        """Register ``client_id``'s new link here, at once (see :class:`Registry`)."""
        if self._registry is not None and self._nc is not None and self._nc.is_connected:
            self._registry.joined(client_id)


def _forwarded(bus: Node, node: str, message: Accepted, sender: str, reply: str) -> Forwarded:
    """``message`` as ``node`` stores it in the stream, with its sender's taint mark there."""
    grants = None if sender == BUS_CLIENT_ID else grants_of(bus, sender)
    return Forwarded(
        node=node,
        topic=message.topic,
        payload=message.payload,
        message_id=message.message_id,
        type=message.type,
        trace_id=message.trace_id,
        sender=sender,
        mark=sender_mark(grants),
        reply=reply,
    )


async def _connect(
    nc: NATS,
    url: str,
    node: str,
    disconnected: Callable[[], Awaitable[None]],
    reconnected: Callable[[], Awaitable[None]],
) -> None:
    """Connect ``nc`` to the NATS server(s) at ``url`` (a comma list), for :data:`CONNECT_TIMEOUT`
    seconds at most; once connected, it reconnects by itself, forever."""

    async def error(exc: Exception) -> None:
        logger.debug("NATS: %r", exc)

    # The first connection is bounded here: nats-py would retry it forever, as it does every
    # later reconnect (which is what a node wants once it has joined).
    async with asyncio.timeout(CONNECT_TIMEOUT):
        await nc.connect(
            # Several servers of one NATS cluster: a comma list, tried in turn.
            servers=[server.strip() for server in url.split(",") if server.strip()],
            name=f"bcpbus {node}",
            no_echo=True,  # a node's own messages never come back to it
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            connect_timeout=CONNECT_TIMEOUT,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            error_cb=error,
        )


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
