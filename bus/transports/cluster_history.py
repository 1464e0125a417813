"""The cluster's message history on JetStream: one stream, one durable consumer per node.

Every message a node accepts goes to the other nodes through the stream :data:`HISTORY_STREAM`
(``js.publish``: stored before the sender goes on), and each node reads the stream through a
durable consumer of its own, named after it. A node acknowledges a message once it has
delivered it and committed its rows; JetStream keeps the rest for it. So a node that was away
(stopped, killed, cut off from NATS) is given, when it is back, every message it missed, in the
stream's order, and its log holds every message of the cluster again: ``fetchMessages`` and
``GET /v1/messages`` on it find them (with its own epochs).

JetStream rather than plain NATS here because this is what it is for: a stream stored on disk
that survives a restart of the NATS server, with a position per reader kept by the server, so
no node keeps a replay protocol of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .cluster_wire import HISTORY_AGE, HISTORY_STREAM, SUBJECT_PREFIX, presence_key

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

__all__ = ["PUBLISH_TIMEOUT", "REDELIVER_AFTER", "history_lost", "logged", "open_history"]

REDELIVER_AFTER = 60.0
"""Seconds before JetStream gives a node again a message it took and never acknowledged: one a
killed node was delivering is delivered again this long after it is back."""
PUBLISH_TIMEOUT = 5.0
"""Seconds a sending node waits for JetStream to store a message."""
_STREAM_IN_USE = 10058
"""JetStream's error code: a stream of that name exists (another node made it first)."""


async def open_history(
    js: JetStreamContext,
    node: str,
    cb: Callable[[Msg], Awaitable[None]],
    *,
    since: datetime | None = None,
) -> JetStreamContext.PushSubscription:
    """Make sure the stream exists, then read it as ``node`` with ``cb`` (which must ack).

    A node new to the cluster starts at the next message, or at the first stored at ``since``
    or later (a consumer made again after NATS lost it: what the others sent since this node
    was cut off is for it too); one that was here before starts after the last message it
    acknowledged.

    Raises:
        nats.js.errors.Error: JetStream refused the stream or the consumer.
    """
    from nats.js.api import ConsumerConfig, DeliverPolicy, StorageType
    from nats.js.errors import BadRequestError

    try:
        await js.add_stream(
            name=HISTORY_STREAM,
            subjects=[f"{SUBJECT_PREFIX}.>"],
            max_age=HISTORY_AGE,
            storage=StorageType.FILE,
        )
    except BadRequestError as exc:
        if exc.err_code != _STREAM_IN_USE:
            raise
    config = ConsumerConfig(
        ack_wait=REDELIVER_AFTER,
        deliver_policy=DeliverPolicy.NEW if since is None else DeliverPolicy.BY_START_TIME,
        opt_start_time=since,
        max_ack_pending=10_000,
    )
    return await js.subscribe(
        f"{SUBJECT_PREFIX}.>",
        durable=_durable(node),
        stream=HISTORY_STREAM,
        cb=cb,
        manual_ack=True,
        config=config,
    )


async def history_lost(js: JetStreamContext, node: str) -> str | None:
    """What of the history is gone: ``"stream"`` (the NATS server came back without its store:
    no ``-sd``, or a new one), ``"consumer"`` (``node``'s alone, or another node made the stream
    again first), or None. Call :func:`open_history` again then, ``since`` the cut-off."""
    from nats.js.errors import NotFoundError

    try:
        await js.stream_info(HISTORY_STREAM)
    except NotFoundError:
        return "stream"
    try:
        await js.consumer_info(HISTORY_STREAM, _durable(node))
    except NotFoundError:
        return "consumer"
    return None


def _durable(node: str) -> str:
    """The name of ``node``'s consumer (names allow no ``.``, ``*`` or ``>``)."""
    return f"node-{presence_key(node)}"


async def logged(db: Path, message_id: str) -> bool:
    """Whether the log at ``db`` has a ``send_start`` row for ``message_id`` (commit first)."""
    return await asyncio.to_thread(_logged, db, message_id)


def _logged(db: Path, message_id: str) -> bool:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        row = conn.execute(
            "SELECT 1 FROM activity_log WHERE message_id = ? AND event = 'send_start' LIMIT 1",
            (message_id,),
        ).fetchone()
    return row is not None
