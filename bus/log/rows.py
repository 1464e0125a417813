"""One activity-log row as the writer buffers, chains and inserts it: :class:`LogRow`."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["COLUMNS", "LogRow"]


class LogRow(NamedTuple):
    """A row :meth:`bus.log.activity.ActivityLog.record` buffered, its columns by name.

    Every value is text or NULL (``epoch`` as decimal text, like ``rpc_id``), so the chain
    encodes each row on its all-text path; ``id`` and ``chain`` are assigned when the row is
    inserted. Being a tuple, a row binds to an ``INSERT`` as it is, in :data:`COLUMNS` order.
    """

    ts: str
    event: str
    message_id: str | None
    rpc_id: str | None
    actor: str | None
    topic: str | None
    status: str | None
    payload_json: str | None
    error: str | None
    # Per message: its epoch (every row of it) and the trace id of its traceparent.
    epoch: str | None
    trace_id: str | None


COLUMNS: tuple[str, ...] = LogRow._fields
"""The columns :meth:`~bus.log.activity.ActivityLog.record` fills, in the order of a
:class:`LogRow` (``id`` and ``chain`` are assigned when it is inserted)."""
