"""The chat's SQLite file: route, retry queue and history, and what survives reopening it."""

from __future__ import annotations

import sqlite3

import pytest

from peers.chat.store import ChatStore, StoreError


def test_a_new_file_is_private_and_belongs_to_one_chat(tmp_path):
    """The file is created 0600 for its chat; another chat may not open it."""
    path = tmp_path / "chat.db"
    ChatStore.open(path, "tg:1").close()
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(StoreError, match="holds the chat tg:1, not tg:2: use another file"):
        ChatStore.open(path, "tg:2")


def test_what_is_not_a_chat_file_is_refused_in_one_line(tmp_path):
    """A directory or a file that is not SQLite: StoreError naming it."""
    with pytest.raises(StoreError, match="is a directory"):
        ChatStore.open(tmp_path, "tg:1")
    (tmp_path / "notes.txt").write_text("not a database, but long enough to be read as one" * 20)
    with pytest.raises(StoreError, match="notes.txt: not a chat database"):
        ChatStore.open(tmp_path / "notes.txt", "tg:1")


def test_the_route_is_kept_and_a_new_agent_starts_unconfigured(tmp_path):
    """assign() stores the agent; the same agent keeps its configured flag, another resets it."""
    store = ChatStore.open(tmp_path / "chat.db", "tg:1")
    assert store.route() is None
    assert store.assign("agent:a")
    store.set_configured(True)
    assert not store.assign("agent:a")
    store.close()
    store = ChatStore.open(tmp_path / "chat.db", "tg:1")
    route = store.route()
    assert route is not None and (route.agent, route.configured) == ("agent:a", True)
    assert store.assign("agent:b")
    assert store.route() == type(route)("agent:b", False)
    store.close()


def test_lines_go_in_order_and_wait_for_their_reply(tmp_path):
    """The oldest line not taken goes first; a taken line comes back once overdue; a reply ends
    it once; attempts and due times survive reopening."""
    store = ChatStore.open(tmp_path / "chat.db", "tg:1")
    first = store.queue("one", now=100.0)
    second = store.queue("two", now=100.0)
    assert store.next_to_send(100.0) == first
    assert store.start_attempt(first.id) == 1
    store.not_delivered(first.id, 105.0)
    assert store.next_to_send(101.0).id == first.id  # still first, though not due
    assert store.next_due_at() == 100.0  # "two" is due, but waits its turn
    store.delivered(first.id, 130.0)
    assert store.next_to_send(101.0).id == second.id
    store.delivered(second.id, 120.0)
    assert store.next_to_send(101.0) is None
    assert store.next_due_at() == 120.0
    store.close()

    store = ChatStore.open(tmp_path / "chat.db", "tg:1")
    overdue = store.next_to_send(131.0)
    assert overdue is not None and (overdue.id, overdue.attempts) == (first.id, 1)
    assert store.answered(first.id) and not store.answered(first.id)
    store.delivered(first.id, 999.0)  # a late result does not reopen an answered line
    assert store.unanswered() == 1
    assert store.answered(second.id) and store.unanswered() == 0
    assert store.next_due_at() is None
    store.close()


def test_history_keeps_both_directions(tmp_path):
    """record() adds a row per message with its direction, type, id, peer and content."""
    store = ChatStore.open(tmp_path / "chat.db", "tg:1")
    store.record("out", "tg_message", {"text": "hi"}, message_id="m.1", peer="agent:a")
    store.record("in", "tg_reply", {"text": "hey"}, message_id="r", peer="agent:a")
    store.close()
    with sqlite3.connect(tmp_path / "chat.db") as db:
        rows = db.execute(
            "SELECT direction, type, message_id, peer, content_json FROM history ORDER BY seq"
        ).fetchall()
    assert rows == [
        ("out", "tg_message", "m.1", "agent:a", '{"text": "hi"}'),
        ("in", "tg_reply", "r", "agent:a", '{"text": "hey"}'),
    ]
