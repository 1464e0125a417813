"""The BCP reader's tools of :class:`~peers.mcp.bridge.Bridge`: take queries, answer, publish.

Queries the gateway sends wait in a queue until the model asks for the next one with
``bcp_next_query``; those handed out stay open, by ``query_id``, until an answer is accepted or
no retries are left. A query that expired while it waited is dropped unread: answering it would
be futile.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from peers.bcp import Reader
from schemas.bcp import BcpQuery

from .inbox import Inbox
from .results import ToolResult, verdict_result
from .shapes import answer_format
from .tools import AnswerArgs, NextQueryArgs, PublishArgs

__all__ = ["ReaderTools"]


class ReaderTools:
    """``bcp_next_query``, ``bcp_answer`` and ``bcp_publish``; the bridge sets the attributes
    below and registers :meth:`_queried` as its reader's query handler."""

    reader: Reader | None
    inbox: Inbox
    _queries: asyncio.Queue[BcpQuery]
    _asked: dict[str, BcpQuery]
    """Queries handed to the model and not yet answered, by query_id."""

    async def _queried(self, content: dict[str, Any]) -> None:
        query = BcpQuery.model_validate(content)
        self._queries.put_nowait(query)
        self.inbox.changed()

    async def _bcp_next_query(self, args: NextQueryArgs) -> ToolResult:
        self._forget_expired()
        try:
            async with asyncio.timeout(args.timeout_s):
                query = await self._queries.get()
                while _expired(query):  # waited unread past its expiry: answering is futile
                    query = await self._queries.get()
        except TimeoutError:
            return ToolResult.of({"query": None}, f"no query arrived within {args.timeout_s} s")
        self._asked[query.query_id] = query
        shown = {
            "query_id": query.query_id,
            "controller": query.controller,
            "expires_at": query.expires_at.isoformat() if query.expires_at else None,
            "spec": query.as_spec().model_dump(mode="json", exclude_none=True),
            "answer_format": answer_format(query),
        }
        return ToolResult.of({"query": shown})

    async def _bcp_answer(self, args: AnswerArgs) -> ToolResult:
        assert self.reader is not None
        query = self._asked.get(args.query_id)
        if query is None:
            return ToolResult.failed(
                f"no open query {args.query_id!r}: answer a query_id that bcp_next_query returned"
            )
        verdict = await self.reader.answer(query.controller, args.query_id, args.response)
        if verdict.success or not verdict.retries_left:
            self._asked.pop(args.query_id, None)
        return verdict_result(verdict)

    def _forget_expired(self) -> None:
        for query_id in [q.query_id for q in self._asked.values() if _expired(q)]:
            del self._asked[query_id]

    async def _bcp_publish(self, args: PublishArgs) -> ToolResult:
        assert self.reader is not None
        controllers = [
            str(s["controller"])
            for s in self.reader.subscriptions
            if s.get("subscription_id") == args.subscription_id
            and args.controller in (None, s.get("controller"))
        ]
        if len(set(controllers)) != 1:
            known = sorted({str(s.get("subscription_id")) for s in self.reader.subscriptions})
            what = "no" if not controllers else "more than one"
            return ToolResult.failed(
                f"{what} active subscription {args.subscription_id!r}"
                f"{'' if controllers else f'; active: {known}'}"
                f"{'; name the controller' if controllers else ''}"
            )
        verdict = await self.reader.publish(args.subscription_id, controllers[0], args.data)
        return verdict_result(verdict)


def _expired(query: BcpQuery) -> bool:
    return query.expires_at is not None and query.expires_at <= datetime.now(UTC)
