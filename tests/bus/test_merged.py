"""Several nodes' activity logs read as one (:mod:`bus.log.merged`), on real SQLite files."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog
from bus.log.merged import merged_rows

MESSAGE = "m-1"
EPOCH = 1_000_000


async def _write(path: Path, rows: list[tuple[LogEvent, dict[str, object]]]) -> None:
    async with ActivityLog(path) as log:
        for event, columns in rows:
            log.record(event, message_id=MESSAGE, epoch=EPOCH, **columns)
        await log.commit()


def test_no_row_of_a_message_comes_before_its_start_on_the_node_that_accepted_it(tmp_path):
    """Node b wrote its rows of the message before node a wrote a's send_start (b's clock or
    its reading ran ahead): the merged story still opens with a's send_start, then b's rows in
    their own order, then a's later rows by time."""
    asyncio.run(
        _write(
            tmp_path / "b.db",
            [
                (LogEvent.CLUSTER_IN, {"actor": "w:0", "payload": {"node": "a", "epoch": EPOCH}}),
                (LogEvent.SEND_START, {"actor": "w:0"}),
                (LogEvent.PROCESS_FINISH, {"actor": "w:2", "status": "processed"}),
            ],
        )
    )
    asyncio.run(
        _write(
            tmp_path / "a.db",
            [
                (LogEvent.SEND_START, {"actor": "w:0"}),
                (LogEvent.CLUSTER_OUT, {"actor": "w:0", "status": "1/1 nodes answered"}),
                (LogEvent.SEND_FINISH, {"actor": "w:0", "status": "delivered 1/1"}),
            ],
        )
    )
    story = merged_rows([tmp_path / "a.db", tmp_path / "b.db"], message_id=MESSAGE)
    assert [(row["node"], row["event"]) for row in story] == [
        ("a", "send_start"),
        ("b", "cluster_in"),
        ("b", "send_start"),
        ("b", "process_finish"),
        ("a", "cluster_out"),
        ("a", "send_finish"),
    ]


def test_without_a_known_origin_rows_stay_in_time_order(tmp_path):
    """Filtered to send_start rows only, no node is known to have accepted the message: the
    rows come in time order, as written."""
    asyncio.run(_write(tmp_path / "b.db", [(LogEvent.SEND_START, {"actor": "w:0"})]))
    asyncio.run(_write(tmp_path / "a.db", [(LogEvent.SEND_START, {"actor": "w:0"})]))
    story = merged_rows(
        [tmp_path / "a.db", tmp_path / "b.db"], message_id=MESSAGE, event="send_start"
    )
    assert [row["node"] for row in story] == ["b", "a"]
    assert story[0]["ts"] <= story[1]["ts"]
