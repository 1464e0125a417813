"""The cluster's one order on JetStream: one stream, read in order by every node.

Every message a node accepts is stored in the stream :data:`HISTORY_STREAM` first
(``js.publish``), and every node, the sending one included, accepts it when its ordered
reading of the stream reaches it: so the rows of every node's log follow the stream, and the
message at stream sequence ``seq`` has the same epoch on every node, ``base + seq *
STREAM_STEP`` (:mod:`bus.core.epochs`). The ``base`` is agreed once per stream in the key-value
bucket :data:`EPOCHS_BUCKET` (a create-only key named after the stream's creation time): the
first node to propose wins, with a base above its log's last epoch and the clock.

A node's position in the stream is its log's last epoch: it reads on from there when it
starts again (after ``kill -9`` too), and from the stream's next message when it is new to it.
A stream made again (the NATS server came back without its store) starts at sequence 1 under a
new base, above every epoch given before.

JetStream rather than plain NATS because this is what it is for: a stream stored on disk that
survives a restart of the NATS server, one order for every reader, so no node keeps an order
or a replay protocol of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .cluster_wire import EPOCHS_BUCKET, HISTORY_AGE, HISTORY_STREAM, SUBJECT_PREFIX

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js.api import StreamInfo
    from nats.js.client import JetStreamContext

__all__ = [
    "BASE_MARGIN",
    "PUBLISH_TIMEOUT",
    "agree_base",
    "open_stream",
    "read_history",
    "stream_lost",
]

logger = logging.getLogger("bus.transports.cluster")

PUBLISH_TIMEOUT = 5.0
"""Seconds a sending node waits for JetStream to store a message."""
BASE_MARGIN = 1 << 40
"""How far above a node's last epoch (and the clock, in microseconds: some 12 days) it
proposes a stream's base: the room for another node whose log is ahead of it (by up to some
10**9 stream messages) when a stream is made again."""
_STREAM_IN_USE = 10058
"""JetStream's error code: a stream of that name exists (another node made it first)."""


async def open_stream(js: JetStreamContext, dedupe: float | None) -> StreamInfo:
    """Make sure the stream exists (another node may have made it first) and that it
    remembers the ids of the messages stored in the last ``dedupe`` seconds at least (its
    ``duplicate_window``: the bus's ``dedup_window``; None keeps JetStream's); return its info.

    Raises:
        nats.js.errors.Error: JetStream refused the stream or the change.
    """
    from nats.js.api import StorageType, StreamConfig
    from nats.js.errors import BadRequestError

    wanted = None if dedupe is None else min(dedupe, HISTORY_AGE)
    config = StreamConfig(
        name=HISTORY_STREAM,
        subjects=[f"{SUBJECT_PREFIX}.>"],
        max_age=HISTORY_AGE,
        storage=StorageType.FILE,
    )
    try:
        await js.add_stream(config if wanted is None else config.evolve(duplicate_window=wanted))
    except BadRequestError as exc:
        if exc.err_code != _STREAM_IN_USE:
            raise
    info = await js.stream_info(HISTORY_STREAM)
    if wanted is not None and (info.config.duplicate_window or 0) < wanted:
        # Made by a node with a shorter window (or before nodes set one): widen it, never
        # narrow it, so that nodes whose configs differ do not undo each other's change.
        info = await js.update_stream(info.config.evolve(duplicate_window=wanted))
    return info


async def agree_base(js: JetStreamContext, stream: StreamInfo, last_epoch: int) -> int:
    """The base of ``stream``'s epochs, as the first node to ask proposed it: above its
    ``last_epoch`` and the clock by :data:`BASE_MARGIN`.

    Raises:
        nats.js.errors.Error: the key-value store refused.
    """
    from nats.js.errors import KeyWrongLastSequenceError

    kv = await js.create_key_value(bucket=EPOCHS_BUCKET, history=1)
    created = stream.created.timestamp() if stream.created is not None else 0.0
    key = f"base.{int(created * 1_000_000)}"
    proposal = max(last_epoch, time.time_ns() // 1000) + BASE_MARGIN
    try:
        await kv.create(key, str(proposal).encode())
    except KeyWrongLastSequenceError:
        pass  # another node proposed first: its base is the stream's
    entry = await kv.get(key)
    assert entry.value is not None
    return int(entry.value)


async def read_history(
    js: JetStreamContext, start: int, cb: Callable[[Msg], Awaitable[None]]
) -> JetStreamContext.PushSubscription:
    """Read the stream in order from sequence ``start`` with ``cb`` (called one message at a
    time, in order; an ordered consumer: JetStream's own, made again by the client after a
    gap or a silence, nothing to acknowledge).

    Raises:
        nats.js.errors.Error: JetStream refused the consumer.
    """
    from nats.js.api import ConsumerConfig, DeliverPolicy

    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(start, 1)
    )
    return await js.subscribe(
        f"{SUBJECT_PREFIX}.>",
        stream=HISTORY_STREAM,
        cb=cb,
        ordered_consumer=True,
        idle_heartbeat=1.0,
        config=config,
    )


async def stream_lost(js: JetStreamContext, created: object) -> bool:
    """Whether the stream made at ``created`` is gone (the NATS server came back without its
    store: no ``-sd``, or a new one), or was made again meanwhile by another node."""
    from nats.js.errors import NotFoundError

    try:
        info = await js.stream_info(HISTORY_STREAM)
    except NotFoundError:
        return True
    return info.created != created
