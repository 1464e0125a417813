"""Read the activity log: the queries behind ``bcpbus audit`` and their terminal/JSON output.

Everything here is synchronous and opens the database read-only, so an auditor can run it while
the bus writes (WAL lets readers and the writer work at once). Each function takes the path of
the SQLite file and returns plain dicts, one per row; :func:`format_table` and :func:`to_json`
turn them into text.

The log holds text written by hostile readers, so :func:`format_table` escapes control and
invisible characters instead of letting them reach the terminal (:func:`neutralize`, which the
approver's view uses too).

:func:`verify` checks the log's hash chain (:mod:`bus.log.chain`) and, with the public key, its
signed checkpoints (:mod:`bus.log.checkpoints`); :func:`head` reads the last row's id and hash,
which :func:`verify` takes back as ``expect_head``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.errors import InvalidParams
from ..core.topics import matches, validate_pattern
from .chain import Problem, Verifier, parse_head
from .chain_v1 import load_key
from .checkpoints import (
    Findings,
    VerifierKey,
    check,
    default_checkpoints_path,
    load_verifier_key,
    read_notes,
)
from .logfile import check_triggers, scan
from .schema import SCHEMA

__all__ = [
    "MAX_LIMIT",
    "REFUSAL_EVENTS",
    "Verification",
    "bits_per_channel",
    "format_table",
    "has_relation",
    "head",
    "last_id",
    "neutralize",
    "query_detail",
    "query_rows",
    "query_story",
    "read_only",
    "refusals_per_reason",
    "to_json",
    "to_jsonl",
    "untrusted_lines",
    "verify",
]

REFUSAL_EVENTS: tuple[str, ...] = (
    "bcp_query_refused",
    "bcp_push_refused",
    "refused",
    "taint_refused",
    "bcp_query_failed",
)
"""The events :func:`refusals_per_reason` counts; each carries its reason in ``status``."""

MAX_LIMIT = (1 << 63) - 1
"""The largest ``limit`` of :func:`query_rows`: SQLite's integers are signed 64-bit."""

# Rows whose payload is not valid JSON (another writer, a damaged file) must not make the whole
# query fail: json_extract() raises on malformed text, so check json_valid() first.
_QUERY_ID = "CASE WHEN json_valid(payload_json) THEN json_extract(payload_json, '$.query_id') END"


# Opening the database


@contextlib.contextmanager
def read_only(db: str | os.PathLike[str]) -> Iterator[sqlite3.Connection]:
    """Open ``db`` read-only with rows as :class:`sqlite3.Row`, and close it afterwards.

    Use :func:`has_relation` to check for the table or view you read.

    Raises:
        FileNotFoundError: there is no such file.
        IsADirectoryError: ``db`` is a directory.
    """
    path = Path(db).resolve()
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a database file")
    if not path.is_file():
        raise FileNotFoundError(f"database not found: {path}")
    # mode=ro: readers never write; as_uri() percent-encodes the path for the URI.
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        yield conn
    finally:
        conn.close()


def has_relation(conn: sqlite3.Connection, name: str) -> bool:
    """Return whether the database has a table or view called ``name``."""
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?", (name,)
    ).fetchone()
    return found is not None


@contextlib.contextmanager
def _connect(db: str | os.PathLike[str]) -> Iterator[sqlite3.Connection]:
    """:func:`read_only` for an activity log; SQLite's errors, here or in the caller's queries,
    become a ``ValueError`` that names the file (the CLI prints it as one line)."""
    try:
        with read_only(db) as conn:
            # Text another writer or a damaged page stored as invalid UTF-8 still prints.
            conn.text_factory = _lenient_text
            if not has_relation(conn, "activity_log"):
                raise ValueError(f"{db} is not an activity log: it has no activity_log table")
            yield conn
    except sqlite3.OperationalError as exc:
        # Locked, unreadable (permissions), or an I/O error: the file may be fine later.
        raise ValueError(f"{db}: cannot read the activity log: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise ValueError(
            f"{db} is not an SQLite database, or it is damaged ({exc}): give the file "
            "`bcpbus serve --db` writes"
        ) from exc


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _fetch(
    db: str | os.PathLike[str], sql: str, params: Sequence[Any] = ()
) -> list[dict[str, Any]]:
    with _connect(db) as conn:
        return [dict(row) for row in conn.execute(sql, params)]


# Queries


def query_rows(
    db: str | os.PathLike[str],
    *,
    message_id: str | None = None,
    topic: str | None = None,
    actor: str | None = None,
    since: str | None = None,
    until: str | None = None,
    event: str | None = None,
    limit: int | None = 1000,
    after_id: int = 0,
    through_id: int | None = None,
    newest: bool = False,
) -> list[dict[str, Any]]:
    """Return the log rows that pass every given filter, oldest first (by id).

    Args:
        db: the SQLite file.
        message_id, actor, event: exact values.
        topic: a subscription pattern (``bcp:*``, ``bcp:*:researcher``) or an exact topic.
        since: keep rows at or after this ISO-8601 date or datetime (a bare date is midnight UTC,
            a datetime without offset is UTC).
        until: keep rows strictly before it, so ``since=D, until=D+1`` is the whole day D.
        limit: most rows returned, 0 to :data:`MAX_LIMIT`; ``None`` for all.
        after_id, through_id: keep rows whose id is above ``after_id`` and at most
            ``through_id`` (``audit --follow`` reads each new stretch of the log once).
        newest: with ``limit``, the last rows that pass rather than the first (still oldest
            first).

    Returns:
        One dict per row with every column of ``activity_log``.

    Raises:
        FileNotFoundError: ``db`` does not exist.
        IsADirectoryError: ``db`` is a directory.
        ValueError: ``db`` is not an activity log or not readable, or a filter is malformed (the
            message says which); show it to the user.
    """
    if limit is not None and not 0 <= limit <= MAX_LIMIT:
        # SQLite cannot bind a larger integer, and reads a negative LIMIT as "no limit".
        raise ValueError(f"limit: {limit} is out of range: give a number from 0 to {MAX_LIMIT}")
    where, params = _filters(
        {"message_id": message_id, "actor": actor, "event": event}, topic, since, until
    )
    if after_id:
        where.append("id > ?")
        params.append(after_id)
    if through_id is not None:
        where.append("id <= ?")
        params.append(through_id)
    sql = "SELECT * FROM activity_log"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id DESC" if newest else " ORDER BY id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    if newest:
        sql = f"SELECT * FROM ({sql}) ORDER BY id"
    with _connect(db) as conn:
        # The pattern test runs inside SQLite so LIMIT counts only matching rows.
        conn.create_function("topic_matches", 2, _topic_matches, deterministic=True)
        return [dict(row) for row in conn.execute(sql, params)]


def last_id(db: str | os.PathLike[str]) -> int:
    """Return the id of the log's last row, 0 if it has none.

    Raises:
        FileNotFoundError: ``db`` does not exist.
        ValueError: ``db`` is not an activity log.
    """
    with _connect(db) as conn:
        [(found,)] = conn.execute("SELECT MAX(id) FROM activity_log")
    return int(found or 0)


def _filters(
    exact: dict[str, str | None], topic: str | None, since: str | None, until: str | None
) -> tuple[list[str], list[Any]]:
    """The WHERE clauses and their parameters for :func:`query_rows`'s filters."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in exact.items():
        if value is not None:
            where.append(f"{column} = ?")
            params.append(_text(value, column))
    if since is not None:
        where.append("ts >= ?")
        params.append(_normalize_time(since, "since"))
    if until is not None:
        where.append("ts < ?")
        params.append(_normalize_time(until, "until"))
    if topic is not None:
        clauses, topic_params = _topic_filter(topic)
        where.extend(clauses)
        params.extend(topic_params)
    return where, params


def bits_per_channel(
    db: str | os.PathLike[str],
    *,
    topic: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> list[dict[str, Any]]:
    """Return what crossed each BCP channel: bits charged, refunded and delivered, budget left.

    ``charged`` adds up the gateway's charges (``bcp_bits_charged`` rows with positive bits: a
    query's reserve when the reader got it, a push), ``refunded`` what it gave back once a
    query's outcome was known (negative bits), ``delivered`` the answer bits of the deliveries
    that reached the controller (``bcp_delivered``). Charged less refunded is what the budget
    paid: ``delivered`` plus what the outcomes themselves carry (one bit per answer, 3.585 per
    failure; see docs/bcp.md) and their timing. ``value``, ``outcome`` and ``timing`` split what
    the deliveries and failures that reached the controller were charged (their ``bits``
    object, logged as ``split``). ``budget_left`` is as of the latest charge, or the whole
    budget if the channel's budget was reset after it.

    Args:
        topic, since, until: as :func:`query_rows`: a channel (pattern) and a time window.

    Returns:
        One dict per channel, by channel name: ``channel``, ``charged``, ``refunded``,
        ``delivered``, ``deliveries``, ``value``, ``outcome``, ``timing``, ``budget_bits``,
        ``budget_left``, ``last_ts``.

    Raises:
        FileNotFoundError: ``db`` does not exist.
        ValueError: ``db`` is not an activity log, or a filter is malformed.
    """
    where, params = _filters({}, topic, since, until)
    where.append(
        "event IN ('bcp_bits_charged', 'bcp_delivered', 'bcp_budget_reset', 'bcp_query_failed')"
    )
    where.append("json_valid(payload_json)")
    sql = f"""
        SELECT id, ts, event,
               json_extract(payload_json, '$.channel') AS channel,
               json_extract(payload_json, '$.bits') AS bits,
               json_extract(payload_json, '$.budget_bits') AS budget_bits,
               json_extract(payload_json, '$.budget_left') AS budget_left,
               json_extract(payload_json, '$.split') AS split
        FROM activity_log WHERE {" AND ".join(where)} ORDER BY id
    """
    channels: dict[str, dict[str, Any]] = {}
    with _connect(db) as conn:
        conn.create_function("topic_matches", 2, _topic_matches, deterministic=True)
        for row in conn.execute(sql, params):
            _tally(channels, row)
    return [channels[name] for name in sorted(channels)]


def _tally(channels: dict[str, dict[str, Any]], row: sqlite3.Row) -> None:
    name = row["channel"]
    if not isinstance(name, str):
        return
    entry = channels.setdefault(
        name,
        {
            "channel": name,
            "charged": 0.0,
            "refunded": 0.0,
            "delivered": 0.0,
            "deliveries": 0,
            "value": 0.0,
            "outcome": 0.0,
            "timing": 0.0,
            "budget_bits": None,
            "budget_left": None,
            "last_ts": None,
        },
    )
    bits = row["bits"] if isinstance(row["bits"], int | float) else 0.0
    if row["event"] in ("bcp_delivered", "bcp_query_failed"):
        _split(entry, row["split"])
    if row["event"] == "bcp_query_failed":
        return
    if row["event"] == "bcp_delivered":
        entry["delivered"] += bits
        entry["deliveries"] += 1
        return
    if row["event"] == "bcp_budget_reset":
        if entry["budget_bits"] is not None:
            entry["budget_left"] = entry["budget_bits"]
        return
    entry["charged" if bits >= 0 else "refunded"] += abs(bits)
    entry["budget_bits"], entry["budget_left"] = row["budget_bits"], row["budget_left"]
    entry["last_ts"] = row["ts"]


def _split(entry: dict[str, Any], split: Any) -> None:
    """Add a delivery's ``bits`` object (value, outcome, timing) to its channel's totals."""
    try:
        parts = json.loads(split) if isinstance(split, str) else None
    except ValueError:
        return
    if isinstance(parts, dict):
        for key in ("value", "outcome", "timing"):
            if _is_number(parts.get(key)) and parts.get(key) is not None:
                entry[key] += parts[key]


def refusals_per_reason(db: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Return how often each kind of refusal happened, most frequent first.

    Counts the events in :data:`REFUSAL_EVENTS`, grouped by event and reason (``status``).

    Returns:
        One dict per (event, reason): ``event``, ``reason``, ``count``.

    Raises:
        FileNotFoundError: ``db`` does not exist.
        ValueError: ``db`` is not an activity log.
    """
    marks = ",".join("?" * len(REFUSAL_EVENTS))
    sql = f"""
        SELECT event, status AS reason, COUNT(*) AS count
        FROM activity_log
        WHERE event IN ({marks})
        GROUP BY event, status
        ORDER BY count DESC, event, reason
    """
    return _fetch(db, sql, REFUSAL_EVENTS)


def query_story(db: str | os.PathLike[str], query_id: str) -> list[dict[str, Any]]:
    """Return everything the log knows about one BCP query, oldest first.

    That is every row whose payload has this ``query_id``, plus every row that shares a
    ``message_id`` with one of those (the bus's send/process rows for the same messages).

    Raises:
        FileNotFoundError: ``db`` does not exist.
        ValueError: ``db`` is not an activity log.
    """
    _text(query_id, "query_id")
    sql = f"""
        WITH story AS (SELECT id, message_id FROM activity_log WHERE {_QUERY_ID} = ?)
        SELECT * FROM activity_log
        WHERE id IN (SELECT id FROM story)
           OR message_id IN (SELECT message_id FROM story WHERE message_id IS NOT NULL)
        ORDER BY id
    """
    return _fetch(db, sql, (query_id,))


def query_detail(db: str | os.PathLike[str], query_id: str) -> dict[str, Any]:
    """Return what one BCP query asked, what the reader answered and what was delivered.

    Returns:
        ``query_id``; ``channel``, ``category``, ``accepted_ts`` and ``spec`` (the
        controller's question) from ``bcp_query_accepted``; ``answers``, one per
        ``bcp_validation`` row (``ts``, ``status``, ``raw``: the reader's answer as it came,
        untrusted, ``reasons``); ``delivered``, one per ``bcp_delivered`` row (``ts``,
        ``response``: the normalized value the controller got, ``bits``); ``failed`` (the
        ``bcp_query_failed`` reason and detail, or None); ``charged`` and ``refunded`` bits and
        ``outcome``; ``rows``, the whole story as :func:`query_story`. In a log written with
        ``--log-content digest`` the spec, answers and values are ``{"sha256": ...}``.

    Raises:
        FileNotFoundError: ``db`` does not exist.
        ValueError: ``db`` is not an activity log.
    """
    rows = query_story(db, query_id)
    detail: dict[str, Any] = {
        "query_id": query_id,
        "channel": None,
        "category": None,
        "accepted_ts": None,
        "spec": None,
        "answers": [],
        "delivered": [],
        "failed": None,
        "charged": 0.0,
        "refunded": 0.0,
        "outcome": None,
    }
    for row in rows:
        payload = _decoded(row).get("payload")
        if isinstance(payload, dict) and payload.get("query_id") == query_id:
            _add_to_detail(detail, row, payload)
    detail["rows"] = rows
    return detail


def _add_to_detail(detail: dict[str, Any], row: dict[str, Any], payload: dict[str, Any]) -> None:
    event, ts = row["event"], row["ts"]
    if event == "bcp_query_accepted":
        detail.update(
            channel=payload.get("channel"),
            category=payload.get("category"),
            accepted_ts=ts,
            spec=payload.get("spec"),
        )
    elif event == "bcp_validation":
        answer = {"ts": ts, "status": row["status"], "raw": payload.get("raw")}
        detail["answers"].append({**answer, "reasons": payload.get("reasons") or []})
    elif event == "bcp_delivered":
        value = {"ts": ts, "response": payload.get("response"), "bits": payload.get("bits")}
        detail["delivered"].append(value)
        detail["outcome"] = "delivered"
    elif event == "bcp_query_failed":
        detail["failed"] = {"ts": ts, "reason": row["status"], "detail": payload.get("detail")}
        detail["outcome"] = row["status"]
    elif event == "bcp_bits_charged" and isinstance(payload.get("bits"), int | float):
        bits = payload["bits"]
        detail["charged" if bits >= 0 else "refunded"] += abs(bits)


# The chain


@dataclass
class Verification:
    """What :func:`verify` found."""

    rows: int
    head: tuple[int, str] | None
    """The last row's id and hash."""
    problems: list[Problem] = field(default_factory=list)
    """What does not verify, first first; empty when the log is intact."""
    segments: list[dict[str, Any]] = field(default_factory=list)
    """The ``chain_start`` rows: ``id``, ``ts`` and their payload."""
    notes: list[str] = field(default_factory=list)
    """What the auditor should know that is not a problem (rows not yet signed, ...)."""
    signed: Findings | None = None
    """What the checkpoints showed, when a public key was given."""

    @property
    def ok(self) -> bool:
        """Whether every row verified (and the expected head, if given, is there)."""
        return not self.problems


def verify(
    db: str | os.PathLike[str],
    key_file: str | os.PathLike[str] | None = None,
    *,
    pubkey: str | os.PathLike[str] | None = None,
    checkpoints: Sequence[str | os.PathLike[str]] | None = None,
    expect_head: str | None = None,
    start: int = 0,
) -> Verification:
    """Check the whole chain of the log at ``db`` and, with ``pubkey``, its signed checkpoints.

    The chain alone catches a row changed, forged, removed or reordered, a rebuilt table, a
    value's storage class changed, a dropped or changed trigger. The checkpoints catch what
    re-chaining would hide (a forger can recompute every hash, but cannot sign), rows cut from
    the end, and a log emptied or replaced. Nothing here needs a secret.

    Args:
        key_file: the key of rows an earlier version chained (version 1, an HMAC), to check
            them one by one; not needed for the rest.
        pubkey: the verifier key file (``.pub``) of the key the bus signs checkpoints with.
        checkpoints: the checkpoint files; by default ``<db>.checkpoints``.
        expect_head: ``ID:HASH`` as :func:`head` gave it earlier, kept elsewhere.
        start: report nothing wrong before this row, a ``chain_start`` (to check the segment a
            bus started with ``--accept-broken-log``); the rows before it must still be as they
            were when it was written.

    Raises:
        FileNotFoundError: ``db``, ``key_file`` or ``pubkey`` does not exist.
        ValueError: ``db`` is not an activity log, ``key_file`` or ``pubkey`` holds no key, or
            ``expect_head`` is not ``ID:HASH``.
    """
    expected = parse_head(expect_head) if expect_head is not None else None
    verifier = Verifier(load_key(key_file) if key_file is not None else None, start)
    verifier_key = load_verifier_key(pubkey) if pubkey is not None else None
    with _connect(db) as conn:
        scan(conn, verifier)
        result = Verification(verifier.rows, verifier.head, list(verifier.problems))
        result.segments = verifier.segments
        result.problems += check_triggers(conn, SCHEMA)
        if expected is not None:
            result.problems += _check_head(conn, expected)
        _legacy(verifier, result)
        if verifier_key is None:
            result.notes.append(
                "nothing vouches for these rows but themselves: give --pubkey (the .pub of the "
                "key the bus signs checkpoints with) to check its checkpoints"
            )
        else:
            files = list(checkpoints or [default_checkpoints_path(db)])
            _check_signed(conn, verifier_key, files, result)
    return result


def _legacy(verifier: Verifier, result: Verification) -> None:
    if not verifier.legacy_unchecked:
        return
    if not verifier.chained:
        why = (
            "the log is chained by an earlier version (chain 1, an HMAC): give its key (--key), "
            "or let this version's `bcpbus serve` open it once to chain it on"
        )
        result.problems.append(Problem(None, why))
    else:
        result.notes.append(
            f"{verifier.legacy_unchecked} rows chained by an earlier version (chain 1) are checked "
            "as a whole by the chain_start row after them; give --key to check each one"
        )


def _check_signed(
    conn: sqlite3.Connection,
    key: VerifierKey,
    files: list[str | os.PathLike[str]],
    result: Verification,
) -> None:
    notes = []
    for path in files:
        try:
            notes += read_notes(Path(path).read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:
            result.problems.append(Problem(None, f"there is no checkpoint file {path}"))
    [(last,)] = conn.execute("SELECT MAX(id) FROM activity_log")

    def chain_at(row_id: int) -> str | None:
        found = conn.execute("SELECT chain FROM activity_log WHERE id = ?", (row_id,)).fetchone()
        return None if found is None else str(found[0])

    found = check(notes, key, chain_at, last or 0)
    result.signed = found
    result.problems += [Problem(None, problem) for problem in found.problems]
    if not found.signed:
        why = f"no checkpoint signed by {key.name} matches the log: nothing vouches for its rows"
        result.problems.append(Problem(None, why))
    elif last and found.last is not None and last > found.last:
        result.notes.append(
            f"rows {found.last + 1}-{last} come after the last checkpoint: chained, not signed "
            "yet (the bus may be running, or it stopped without a checkpoint)"
        )


def _check_head(conn: sqlite3.Connection, expected: tuple[int, str]) -> list[Problem]:
    row_id, chain = expected
    found = conn.execute("SELECT chain FROM activity_log WHERE id = ?", (row_id,)).fetchone()
    if found is None:
        [(last,)] = conn.execute("SELECT MAX(id) FROM activity_log")
        why = (
            f"the expected head, row {row_id}, is not in the log (it ends at row {last}): rows "
            "were cut from its end"
        )
        return [Problem(None, why)]
    if found[0] != chain:
        return [Problem(row_id, "its hash is not the expected head's: the log was rewritten")]
    return []


def head(db: str | os.PathLike[str]) -> tuple[int, str]:
    """Return the id and hash of the log's last row: keep them where the log's owner cannot
    write, and give them to :func:`verify` as ``expect_head`` (``f"{id}:{hash}"``).

    Raises:
        FileNotFoundError: ``db`` does not exist.
        ValueError: ``db`` is not an activity log, is empty, or its last row has no hash.
    """
    with _connect(db) as conn:
        found = conn.execute(
            "SELECT id, chain FROM activity_log ORDER BY id DESC LIMIT 1"
        ).fetchone()
    if found is None or found["chain"] is None:
        raise ValueError(f"{db}: the log's last row has no hash: run `bcpbus audit verify`")
    return int(found["id"]), str(found["chain"])


# Filters


def _normalize_time(value: str, name: str) -> str:
    """Turn an ISO-8601 date or datetime into the log's ``ts`` format, in UTC.

    Raises:
        ValueError: ``value`` is neither; the message names the option.
    """
    try:
        # Python 3.11 reads a bare date as midnight, and accepts a trailing "Z".
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        raise ValueError(
            f"{name}: {value!r} is not an ISO-8601 date or datetime (2026-05-09T14:30:00Z)"
        ) from None
    except OverflowError:
        # 9999-12-31T23:00:00-05:00 is a valid datetime past the last one UTC can hold.
        raise ValueError(f"{name}: {value!r} is out of range in UTC") from None


def _text(value: str, name: str) -> str:
    """``value``, if SQLite can bind it: a lone surrogate (from undecodable bytes in argv) not.

    Raises:
        ValueError: ``value`` is not valid Unicode; the message names the filter.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name}: {value!r} is not valid text (it is not UTF-8)") from None
    return value


def _topic_matches(pattern: str, topic: str | None) -> bool:
    return topic is not None and matches(pattern, topic)


def _topic_filter(pattern: str) -> tuple[list[str], list[Any]]:
    """Return SQL conditions (and their parameters) for rows whose topic matches ``pattern``.

    Raises:
        ValueError: ``pattern`` is not a valid topic pattern.
    """
    try:
        validate_pattern(pattern)
    except InvalidParams as exc:
        raise ValueError(exc.message) from None
    if "*" not in pattern:
        return ["topic = ?"], [pattern]
    clauses = ["topic_matches(?, topic)"]
    params: list[Any] = [pattern]
    # The literal segments before the first '*' bound the topic to a range the index can use:
    # every topic starting with "bcp:" sorts in ["bcp:", "bcp;"), ';' being the next character.
    prefix = pattern[: pattern.index("*")]
    if prefix:
        clauses[:0] = ["topic >= ?", "topic < ?"]
        params[:0] = [prefix, prefix[:-1] + ";"]
    return clauses, params


# Output

_MAX_CELL = 40
"""Widest a table cell gets before it is cut with '…'."""


def format_table(
    rows: list[dict[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    max_width: int = _MAX_CELL,
    header: bool = True,
) -> str:
    """Render rows as an aligned plain-text table for a terminal.

    Args:
        rows: dicts as the query functions return them.
        columns: which keys to show, in order; by default every key, in first-seen order.
        max_width: cells longer than this are cut, ending in ``…``.
        header: False leaves out the header and the rule (a table printed in parts).

    Returns:
        A header line, a rule, one line per row (no trailing newline); ``"(no rows)"`` if there
        are none. Numbers are right-aligned, ``None`` is blank, and control or invisible
        characters are shown escaped (``\\x1b``), never sent to the terminal.
    """
    if not rows:
        return "(no rows)"
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(row.get(column), max_width) for column in columns] for row in rows]
    widths = [
        max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)
    ]
    numeric = [all(_is_number(row.get(column)) for row in rows) for column in columns]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.rjust(width) if right else value.ljust(width)
            for value, width, right in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    top = [line(list(columns)), "  ".join("-" * width for width in widths)] if header else []
    return "\n".join([*top, *(line(values) for values in cells)])


def to_jsonl(rows: list[dict[str, Any]]) -> str:
    """Render rows as JSON Lines, one object per row (as :func:`to_json`), for log pipelines."""
    return "\n".join(json.dumps(_decoded(row)) for row in rows)


def to_json(rows: list[dict[str, Any]]) -> str:
    """Render rows as a JSON array, one object per line, for other tools.

    ``payload_json`` is decoded into ``payload`` (kept as text if it is not valid JSON).
    Non-ASCII characters are escaped, so the output is safe to print and to pipe.
    """
    objects = [json.dumps(_decoded(row)) for row in rows]
    if not objects:
        return "[]"
    return "[\n" + ",\n".join(objects) + "\n]"


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    if "payload_json" not in row:
        return row
    out = {key: value for key, value in row.items() if key != "payload_json"}
    text = row["payload_json"]
    try:
        out["payload"] = None if text is None else json.loads(text)
    except ValueError:
        out["payload"] = text
    return out


def _is_number(value: Any) -> bool:
    # bool is an int subclass but reads as a word; None (a blank cell) fits any column.
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _cell(value: Any, max_width: int) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        # Two decimals are enough for bits; 671.0 reads as 671.
        text = f"{value:.2f}".rstrip("0").rstrip(".")
    else:
        text = str(value)
    text = neutralize(text)
    if len(text) > max_width:
        text = text[: max_width - 1] + "…"
    return text


def neutralize(text: str) -> str:
    """Return ``text`` with every character that is not plainly printable shown escaped.

    Escape sequences (ESC, CSI), every other C0/C1 control including newline and carriage
    return, bidi overrides and isolates, zero-width and other invisible characters become
    visible Python-style escapes (``\\x1b``, ``\\u202e``), so untrusted text printed to a
    terminal can neither move the cursor, recolour, retitle, nor reorder what a person sees.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def untrusted_lines(value: Any, width: int = 76) -> list[str]:
    """Return lines that show untrusted text (a reader's answer) safely: each starts with
    ``|`` so that none can pass itself off as the frame around it, and each is escaped by
    :func:`neutralize`. A mapping shows one ``key: value`` per entry, wrapped at ``width``.
    """
    if value is None or (isinstance(value, Mapping) and not value):
        return ["| (nothing)"]
    if not isinstance(value, Mapping):
        value = {"(as sent)": value}
    lines: list[str] = []
    for key, item in value.items():
        label = f"| {neutralize(str(key))}: "
        text = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
        paragraphs = text.split("\n")
        if len(paragraphs) == 1 and len(label) + len(neutralize(text)) <= width:
            lines.append(label + neutralize(text))
            continue
        lines.append(label.rstrip())
        for paragraph in paragraphs:
            lines += textwrap.wrap(
                neutralize(paragraph),
                width,
                initial_indent="|   ",
                subsequent_indent="|   ",
                break_on_hyphens=False,
            ) or ["|"]
    return lines


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
