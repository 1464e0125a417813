"""Epochs that follow a cluster's stream (bus.core.epochs): the same on every node."""

from __future__ import annotations

import pytest

from bus.core.epochs import STREAM_STEP, Epochs, NoRoom

BASE = 2_000_000_000_000_000


def test_two_nodes_give_a_stream_message_the_same_epoch_whatever_they_gave_before():
    """Nodes with different logs (one far behind, one with local epochs) give the stream's
    message the epoch its sequence implies, and each node's epochs strictly increase."""
    behind, ahead = Epochs(last=5), Epochs(last=BASE - 1)
    for node in (behind, ahead):
        node.follow(BASE)
    assert behind.at(3) == ahead.at(3) == BASE + 3 * STREAM_STEP
    local = ahead.next()  # the bus's own, while cut off: between two stream messages
    assert BASE + 3 * STREAM_STEP < local < BASE + 4 * STREAM_STEP
    assert behind.at(4) == ahead.at(4) == BASE + 4 * STREAM_STEP
    assert ahead.read() == behind.read() == 4


def test_a_stream_message_read_already_is_refused_and_the_local_room_ends():
    """at() never goes back, and next() stops before the stream's next epoch."""
    epochs = Epochs(last=0)
    epochs.follow(BASE)
    epochs.at(10)
    with pytest.raises(ValueError):
        epochs.at(10)
    given = [epochs.next() for _ in range(STREAM_STEP - 1)]
    assert given[-1] == BASE + 11 * STREAM_STEP - 1
    with pytest.raises(NoRoom):
        epochs.next()
    assert epochs.read() == 10 and epochs.at(11) == BASE + 11 * STREAM_STEP


def test_a_cursor_between_stream_messages_maps_to_the_earlier_one():
    """seq_of() tells which stream message a cursor follows (0: before the stream)."""
    epochs = Epochs()
    epochs.follow(BASE)
    assert epochs.seq_of(BASE - 1) == 0
    assert epochs.seq_of(BASE + 7 * STREAM_STEP) == 7
    assert epochs.seq_of(BASE + 7 * STREAM_STEP + 999) == 7
