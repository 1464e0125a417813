"""The approvals feed follows the log: requests, decisions by anyone, and only new rows."""

from __future__ import annotations

import asyncio

from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog
from peers.console.feed import ApprovalFeed
from peers.testing import scaled


def requested(log: ActivityLog, approval_id: str) -> None:
    request = {"approval_id": approval_id, "kind": "response", "expires_at": None}
    log.record(
        LogEvent.BCP_APPROVAL_REQUESTED, payload={"approval_id": approval_id, "request": request}
    )


async def test_the_feed_reads_requests_and_decisions_and_wakes_waiters(tmp_path):
    """Rows written after the start reach the feed; a waiter wakes on the change."""
    async with ActivityLog(tmp_path / "log.db") as log:
        requested(log, "ap-1")
        await log.commit()
        feed = ApprovalFeed(log.path, interval=0.05, keep_decided=1)
        await feed.start()
        try:
            await feed.refresh()
            assert [a.approval_id for a in feed.approvals] == ["ap-1"]
            with feed.watching():  # a live stream is open: the feed reads on its own
                version = feed.version
                waiter = asyncio.create_task(feed.wait_changed(version, scaled(5)))
                log.record(LogEvent.SEND_START, payload={"unrelated": True})
                log.record(
                    LogEvent.BCP_APPROVAL_DECIDED,
                    actor="human:bob",
                    status="approved",
                    payload={"approval_id": "ap-1", "reason": "fine"},
                )
                requested(log, "ap-2")
                await log.commit()
                assert await waiter > version
                ap1 = feed.get("ap-1")
                assert ap1 is not None and (ap1.status, ap1.decided_by) == ("approved", "human:bob")
                assert feed.get("ap-2") is not None and feed.get("ap-2").status == "pending"
                # Only the newest decided approvals are kept.
                requested(log, "ap-3")
                for approval_id in ("ap-2", "ap-3"):
                    log.record(
                        LogEvent.BCP_APPROVAL_DECIDED,
                        actor="system:gateway",
                        status="expired",
                        payload={"approval_id": approval_id},
                    )
                await log.commit()
                await feed.refresh()
                assert [a.approval_id for a in feed.approvals] == ["ap-3"]
        finally:
            await feed.close()


async def test_a_wait_times_out_when_nothing_changes(tmp_path):
    """With nothing new, wait_changed returns the same version after its timeout."""
    async with ActivityLog(tmp_path / "log.db") as log:
        await log.write(LogEvent.BUS_START)
        feed = ApprovalFeed(log.path)
        await feed.refresh()
        assert await feed.wait_changed(feed.version, 0.01) == feed.version
        assert not await feed.refresh()


async def test_the_first_read_covers_the_horizon_only(tmp_path):
    """Rows older than the horizon are skipped at the start; every row after it is read."""
    async with ActivityLog(tmp_path / "log.db") as log:
        requested(log, "ap-old")
        await log.commit()
        feed = ApprovalFeed(log.path, horizon=-60)  # the horizon starts a minute from now
        assert not await feed.refresh() and feed.approvals == []
        requested(log, "ap-new")
        await log.commit()
        assert await feed.refresh()
        assert [a.approval_id for a in feed.approvals] == ["ap-new"]
        everything = ApprovalFeed(log.path)
        await everything.refresh()
        assert [a.approval_id for a in everything.approvals] == ["ap-old", "ap-new"]
