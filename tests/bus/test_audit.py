"""Tests for bus.log.audit: the read-side queries and their table and JSON output."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bus.core.logevents import LogEvent
from bus.log import audit
from bus.log.activity import ActivityLog
from bus.log.schema import SCHEMA


def make_log(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Create an activity log holding ``rows`` (with chosen timestamps), in order."""
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(SCHEMA)
        for i, row in enumerate(rows):
            fields = {"ts": f"2026-05-09T10:00:{i:02d}.000000Z", **row}
            if "payload" in fields:
                fields["payload_json"] = json.dumps(fields.pop("payload"))
            names = ",".join(fields)
            marks = ",".join("?" * len(fields))
            conn.execute(
                f"INSERT INTO activity_log ({names}) VALUES ({marks})", list(fields.values())
            )
    conn.close()
    return path


def charge(channel: str, bits: float, left: float, query_id: str = "q") -> dict[str, Any]:
    payload = {
        "query_id": query_id,
        "channel": channel,
        "bits": bits,
        "budget_bits": 1000,
        "budget_left": left,
    }
    return {
        "event": "bcp_bits_charged",
        "actor": "system:gateway",
        "topic": channel,
        "payload": payload,
    }


def row(event: str, message_id: str | None, actor: str, topic: str | None) -> dict[str, Any]:
    return {"event": event, "message_id": message_id, "actor": actor, "topic": topic}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Seven rows, ids 1..7, one second apart on 2026-05-09 except the last (May 10)."""
    return make_log(
        tmp_path / "activity.db",
        [
            row("send_start", "m1", "agent:main", "bcp:main:researcher"),
            row("process_start", "m1", "system:gateway", "bcp:main:researcher"),
            {"event": "bcp_query_accepted", "message_id": "m1", "payload": {"query_id": "q1"}},
            row("send_start", "m2", "agent:researcher", "agent:researcher"),
            row("subscribe", None, "agent:main", "system:presence"),
            row("send_start", "m3", "agent:other", "bcp:other:researcher"),
            {"event": "connect", "ts": "2026-05-10T00:00:00.000000Z", "actor": "1.2.3.4"},
        ],
    )


def events(rows: list[dict[str, Any]]) -> list[str]:
    return [row["event"] for row in rows]


# Opening


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    """A db path that does not exist raises FileNotFoundError naming it."""
    missing = tmp_path / "nope.db"
    with pytest.raises(FileNotFoundError, match="nope.db"):
        audit.query_rows(missing)
    assert not missing.exists()  # read-only: nothing was created


def test_file_without_the_table_is_refused(tmp_path: Path) -> None:
    """A SQLite file that is not an activity log raises ValueError saying so."""
    other = tmp_path / "other.db"
    sqlite3.connect(other).close()
    with pytest.raises(ValueError, match="not an activity log"):
        audit.refusals_per_reason(other)


@pytest.mark.parametrize(
    "read",
    [
        audit.query_rows,
        audit.bits_per_channel,
        audit.refusals_per_reason,
        lambda path: audit.query_story(path, "q1"),
    ],
)
def test_file_that_is_not_sqlite_is_a_value_error_naming_it(tmp_path: Path, read: Any) -> None:
    """Every query on a file that is not SQLite raises ValueError naming the file, not
    sqlite3.DatabaseError."""
    junk = tmp_path / "notes.db"
    junk.write_text("these are not the rows you are looking for\n" * 100)
    with pytest.raises(ValueError, match=r"notes\.db is not an SQLite database"):
        read(junk)


def test_directory_is_refused_as_one(tmp_path: Path) -> None:
    """A directory given as the database raises IsADirectoryError saying so."""
    with pytest.raises(IsADirectoryError, match="is a directory"):
        audit.query_rows(tmp_path)


def test_rows_with_invalid_utf8_are_read_with_replacement_characters(tmp_path: Path) -> None:
    """Text stored as invalid UTF-8 (another writer, a damaged page) reads as U+FFFD."""
    log = make_log(tmp_path / "activity.db", [])
    with sqlite3.connect(log) as conn:
        conn.execute(
            "INSERT INTO activity_log (ts, event, error) "
            "VALUES ('2026-05-09T10:00:00.000000Z', 'connect', CAST(x'ff41' AS TEXT))"
        )
    conn.close()
    [read] = audit.query_rows(log)
    assert read["error"] == "\ufffdA"


def test_reads_a_log_the_writer_is_using(tmp_path: Path) -> None:
    """Rows written by ActivityLog are readable while it is still open."""

    async def scenario() -> list[dict[str, Any]]:
        async with ActivityLog(tmp_path / "live.db") as log:
            await log.write(LogEvent.CONNECT, actor="bus")
            return audit.query_rows(log.path)

    rows = asyncio.run(scenario())
    assert events(rows) == ["chain_start", "connect"]


# query_rows


def test_no_filter_returns_all_rows_by_id(db: Path) -> None:
    """Without filters every row comes back, in id order."""
    rows = audit.query_rows(db)
    assert [row["id"] for row in rows] == list(range(1, 8))
    assert set(rows[0]) == {
        "id",
        "ts",
        "event",
        "message_id",
        "rpc_id",
        "actor",
        "topic",
        "status",
        "payload_json",
        "error",
        "chain",
        "epoch",
        "trace_id",
    }


def test_exact_filters_combine(db: Path) -> None:
    """message_id, actor and event are exact and all must hold."""
    assert events(audit.query_rows(db, message_id="m1")) == [
        "send_start",
        "process_start",
        "bcp_query_accepted",
    ]
    assert events(audit.query_rows(db, message_id="m1", actor="system:gateway")) == [
        "process_start"
    ]
    assert len(audit.query_rows(db, event="send_start")) == 3


def test_limit_caps_rows_and_none_lifts_it(db: Path) -> None:
    """limit returns the first rows only; None returns them all."""
    assert [row["id"] for row in audit.query_rows(db, limit=2)] == [1, 2]
    assert len(audit.query_rows(db, limit=None)) == 7
    assert audit.query_rows(db, limit=0) == []
    assert len(audit.query_rows(db, limit=audit.MAX_LIMIT)) == 7


@pytest.mark.parametrize("limit", [-1, audit.MAX_LIMIT + 1, 10**20])
def test_limit_out_of_range_is_a_value_error(db: Path, limit: int) -> None:
    """A negative limit, or one past SQLite's integers, raises ValueError naming limit."""
    with pytest.raises(ValueError, match=f"limit: {limit} is out of range"):
        audit.query_rows(db, limit=limit)


@pytest.mark.parametrize(
    ("since", "until", "ids"),
    [
        ("2026-05-09", "2026-05-10", [1, 2, 3, 4, 5, 6]),  # bare dates: the whole of May 9
        ("2026-05-10", None, [7]),
        ("2026-05-09T10:00:02Z", "2026-05-09T10:00:04", [3, 4]),  # since inclusive, until not
        ("2026-05-09T12:00:05+02:00", None, [6, 7]),  # an offset is converted to UTC
        (None, "2026-05-09T10:00:00.500000Z", [1]),
    ],
)
def test_time_window(db: Path, since: str | None, until: str | None, ids: list[int]) -> None:
    """since and until take ISO-8601 dates or datetimes, in any offset, as [since, until)."""
    assert [row["id"] for row in audit.query_rows(db, since=since, until=until)] == ids


def test_bad_time_says_which_option(db: Path) -> None:
    """A since/until that is not ISO-8601 raises ValueError naming the option."""
    with pytest.raises(ValueError, match="until: 'yesterday'"):
        audit.query_rows(db, until="yesterday")


def test_time_past_what_utc_holds_says_which_option(db: Path) -> None:
    """A valid datetime that overflows when converted to UTC raises ValueError, not
    OverflowError."""
    with pytest.raises(ValueError, match="since: '9999-12-31T23:00:00-05:00' is out of range"):
        audit.query_rows(db, since="9999-12-31T23:00:00-05:00")


@pytest.mark.parametrize("column", ["message_id", "actor", "event"])
def test_filter_that_is_not_unicode_says_which(db: Path, column: str) -> None:
    """A filter holding a lone surrogate (undecodable bytes in argv) raises ValueError naming it."""
    with pytest.raises(ValueError, match=f"{column}: .* is not valid text"):
        filters: dict[str, Any] = {column: "agent:\udcff"}
        audit.query_rows(db, **filters)
    with pytest.raises(ValueError, match="query_id"):
        audit.query_story(db, "\udcff")


@pytest.mark.parametrize(
    ("pattern", "ids"),
    [
        ("bcp:main:researcher", [1, 2]),  # exact
        ("bcp:*", [1, 2, 6]),  # trailing '*': one or more segments
        ("bcp:*:researcher", [1, 2, 6]),  # middle '*': exactly one segment
        ("*:researcher", [4]),
        ("*:*:researcher", [1, 2, 6]),
        ("system:*", [5]),
        ("bcp:main:*", [1, 2]),
        ("agent", []),
    ],
)
def test_topic_pattern(db: Path, pattern: str, ids: list[int]) -> None:
    """topic filters by subscription pattern, with the bus's '*' rules."""
    assert [row["id"] for row in audit.query_rows(db, topic=pattern)] == ids


def test_topic_pattern_needs_a_segment_after_the_prefix(tmp_path: Path) -> None:
    """'bcp:*' matches neither the bare 'bcp' topic nor a topic like 'bcpx:a'."""
    path = make_log(
        tmp_path / "a.db",
        [
            {"event": "send_start", "topic": "bcp"},
            {"event": "send_start", "topic": "bcpx:a"},
            {"event": "send_start", "topic": "bcp:a"},
        ],
    )
    assert [row["topic"] for row in audit.query_rows(path, topic="bcp:*")] == ["bcp:a"]


def test_limit_counts_only_matching_topics(db: Path) -> None:
    """With a pattern, limit counts rows that match it, not rows scanned."""
    assert [row["id"] for row in audit.query_rows(db, topic="*:*:researcher", limit=3)] == [
        1,
        2,
        6,
    ]


def test_bad_topic_pattern_is_a_value_error(db: Path) -> None:
    """A malformed pattern raises ValueError with the topic module's explanation."""
    with pytest.raises(ValueError, match="invalid pattern"):
        audit.query_rows(db, topic="bcp::x")


# Aggregates


def test_bits_per_channel(tmp_path: Path) -> None:
    """Charged, refunded and delivered are apart per channel, and split into value, outcome
    and timing; the budget left is the latest charge's, or the whole budget after a reset."""
    path = make_log(
        tmp_path / "a.db",
        [
            charge("bcp:main:researcher", 7.9, 992.1),
            {
                "event": "bcp_delivered",
                "payload": {
                    "channel": "bcp:main:researcher",
                    "bits": 6.9,
                    "split": {"value": 6.9, "outcome": 1.0, "timing": 2.0},
                },
            },
            charge("bcp:main:other", 671.0, 329.0),
            charge("bcp:main:researcher", 441.0, 551.1),
            charge("bcp:main:researcher", -437.4, 988.5),  # a rejected summary's refund
            {"event": "bcp_bits_charged", "payload_json": "{not json"},
            {"event": "bcp_budget_reset", "payload": {"channel": "bcp:main:other"}},
            {
                "event": "bcp_query_failed",
                "payload": {
                    "channel": "bcp:main:researcher",
                    "split": {"value": 0.0, "outcome": 3.585, "timing": 4.0},
                },
            },
        ],
    )
    rows = audit.bits_per_channel(path)
    assert rows == [
        {
            "channel": "bcp:main:other",
            "charged": 671.0,
            "refunded": 0.0,
            "delivered": 0.0,
            "deliveries": 0,
            "value": 0.0,
            "outcome": 0.0,
            "timing": 0.0,
            "budget_bits": 1000,
            "budget_left": 1000,
            "last_ts": "2026-05-09T10:00:02.000000Z",
        },
        {
            "channel": "bcp:main:researcher",
            "charged": pytest.approx(448.9),
            "refunded": pytest.approx(437.4),
            "delivered": pytest.approx(6.9),
            "deliveries": 1,
            "value": pytest.approx(6.9),
            "outcome": pytest.approx(4.585),
            "timing": pytest.approx(6.0),
            "budget_bits": 1000,
            "budget_left": 988.5,
            "last_ts": "2026-05-09T10:00:04.000000Z",
        },
    ]
    # A time window and a channel pattern narrow it.
    window = audit.bits_per_channel(path, topic="bcp:main:*", since="2026-05-09T10:00:03Z")
    assert [(r["channel"], r["charged"]) for r in window] == [("bcp:main:researcher", 441.0)]


def test_untrusted_lines_escape_and_mark_every_line() -> None:
    """A reader's answer is shown escaped, every line behind '|', whatever its shape."""
    lines = audit.untrusted_lines({"summary": "ok\x1b[2J\nnext \u202eline"}, width=40)
    assert all(line.startswith("|") for line in lines)
    assert "\\x1b[2J" in "\n".join(lines) and "\\u202e" in "\n".join(lines)
    assert audit.untrusted_lines(["not", "a", "mapping"]) == [
        '| (as sent): ["not", "a", "mapping"]'
    ]
    assert audit.untrusted_lines(None) == ["| (nothing)"]


def test_to_jsonl_is_one_object_a_line(db: Path) -> None:
    """JSON Lines: each row alone on its line, payload decoded."""
    lines = audit.to_jsonl(audit.query_rows(db, limit=3)).splitlines()
    assert [json.loads(line)["id"] for line in lines] == [1, 2, 3]
    assert json.loads(lines[2])["payload"] == {"query_id": "q1"}


def test_newest_rows_and_id_ranges(db: Path) -> None:
    """newest takes the last rows (still oldest first); after_id/through_id bound the ids."""
    assert [r["id"] for r in audit.query_rows(db, limit=2, newest=True)] == [6, 7]
    assert [r["id"] for r in audit.query_rows(db, after_id=2, through_id=4)] == [3, 4]
    assert audit.last_id(db) == 7


def test_refusals_per_reason(tmp_path: Path) -> None:
    """Refusal events are counted per event and reason, most frequent first."""
    path = make_log(
        tmp_path / "a.db",
        [
            {"event": "refused", "status": "type_not_allowed"},
            {"event": "bcp_query_refused", "status": "budget_exhausted"},
            {"event": "refused", "status": "type_not_allowed"},
            {"event": "taint_refused", "status": "high->low"},
            {"event": "bcp_push_refused", "status": "subscription_not_found"},
            {"event": "bcp_query_failed", "status": "timeout"},
            {"event": "send_start", "status": "type_not_allowed"},
        ],
    )
    assert audit.refusals_per_reason(path) == [
        {"event": "refused", "reason": "type_not_allowed", "count": 2},
        {"event": "bcp_push_refused", "reason": "subscription_not_found", "count": 1},
        {"event": "bcp_query_failed", "reason": "timeout", "count": 1},
        {"event": "bcp_query_refused", "reason": "budget_exhausted", "count": 1},
        {"event": "taint_refused", "reason": "high->low", "count": 1},
    ]


def test_query_story_follows_message_ids(tmp_path: Path) -> None:
    """A query's story is its gateway rows plus the bus rows of the same messages, by id."""
    path = make_log(
        tmp_path / "a.db",
        [
            {"event": "send_start", "message_id": "m1"},
            {"event": "bcp_query_accepted", "message_id": "m1", "payload": {"query_id": "q1"}},
            {"event": "send_start", "message_id": "m9"},
            {"event": "bcp_query_accepted", "message_id": "m9", "payload": {"query_id": "q2"}},
            {"event": "bcp_query_failed", "status": "timeout", "payload": {"query_id": "q1"}},
            {"event": "rpc_error", "payload_json": "{broken"},
            {"event": "send_finish", "message_id": "m1"},
            {"event": "connect", "payload": ["q1"]},
        ],
    )
    story = audit.query_story(path, "q1")
    assert [row["id"] for row in story] == [1, 2, 5, 7]
    assert audit.query_story(path, "unknown") == []


# Output


def test_format_table_aligns_columns() -> None:
    """Text is left-aligned, numbers right-aligned, None blank, under a header and a rule."""
    rows = [
        {"event": "refused", "count": 2, "bits": 6.91, "note": None},
        {"event": "bcp_query_refused", "count": 10, "bits": 671.0, "note": "x"},
    ]
    assert audit.format_table(rows).splitlines() == [
        "event              count  bits  note",
        "-----------------  -----  ----  ----",
        "refused                2  6.91",
        "bcp_query_refused     10   671  x",
    ]


def test_format_table_picks_columns_in_order() -> None:
    """columns chooses which keys appear and in what order; missing keys are blank."""
    rows = [{"a": "1", "b": "2"}, {"a": "3", "c": "4"}]
    assert audit.format_table(rows, ["c", "a"]).splitlines() == ["c  a", "-  -", "   1", "4  3"]
    assert audit.format_table(rows).splitlines()[0] == "a  b  c"


def test_format_table_truncates_long_cells() -> None:
    """Cells longer than max_width are cut to it, ending in '…'."""
    [_, _, line] = audit.format_table([{"x": "y" * 100}], max_width=10).splitlines()
    assert line == "y" * 9 + "…"


def test_format_table_escapes_terminal_controls() -> None:
    """Escape sequences, bidi overrides and newlines from the log are shown, never emitted."""
    hostile = "ok\x1b[2J\u202eevil\n\U000e0041"
    [_, _, line] = audit.format_table([{"x": hostile}], max_width=100).splitlines()
    assert line == "ok\\x1b[2J\\u202eevil\\x0a\\U000e0041"
    assert line.isprintable()


def test_format_table_without_rows() -> None:
    """An empty result renders as '(no rows)'."""
    assert audit.format_table([]) == "(no rows)"


def test_format_table_renders_booleans_as_text() -> None:
    """A boolean column is text, left-aligned, not a number."""
    assert audit.format_table([{"ok": True}, {"ok": False}]).splitlines()[2:] == ["True", "False"]


def test_to_json_decodes_payloads(db: Path) -> None:
    """to_json emits one object per row with payload_json decoded into payload."""
    rows = audit.query_rows(db, message_id="m1")
    text = audit.to_json(rows)
    assert len(text.splitlines()) == 2 + len(rows)
    objects = json.loads(text)
    assert objects[2]["payload"] == {"query_id": "q1"}
    assert objects[0]["payload"] is None
    assert "payload_json" not in objects[0]


def test_to_json_keeps_undecodable_payload_text() -> None:
    """A payload_json that is not JSON is kept as text; rows without one pass through."""
    objects = json.loads(audit.to_json([{"payload_json": "{broken"}, {"channel": "c"}]))
    assert objects == [{"payload": "{broken"}, {"channel": "c"}]


def test_to_json_empty_and_escaped() -> None:
    """No rows is an empty array; non-ASCII is escaped so the text is safe to print."""
    assert json.loads(audit.to_json([])) == []
    assert audit.to_json([{"x": "\u202e"}]) == '[\n{"x": "\\u202e"}\n]'
