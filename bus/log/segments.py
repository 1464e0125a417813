"""What both versions of the activity log's chain share: rows, segments, heads, and their checks.

A ``chain_start`` row begins a segment and is hashed with :data:`GENESIS` in place of a previous
row's hash; every other row is linked to the one before it. :class:`SegmentChecks` holds the
steps a verifier of either version takes between rows and segments, so that a broken link reads
the same whatever version chained it: :class:`~bus.log.chain.Verifier` (version 2) and
:class:`~bus.log.chain_v1.LegacyVerifier` (version 1) build on it, each with its own hash of a
row's content (its :data:`Mac`). Both import this module, and neither imports the other's
base, so the imports run one way: segments <- chain_v1 <- chain.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "CHAIN_START",
    "GENESIS",
    "Head",
    "Mac",
    "Problem",
    "SegmentChecks",
    "parse_head",
    "payload_of",
    "unhex",
]

GENESIS = bytes(32)
"""What a ``chain_start`` row is hashed with in place of a previous row's hash."""

CHAIN_START = "chain_start"


Mac = Callable[[bytes, bytes], bytes]
"""A chain version's hash of a row's content, keyed by the hash before it."""


class Head(NamedTuple):
    """The log's last row as a head: its id and its ``chain``; ``str()`` writes ``ID:HASH``."""

    id: int
    chain: str

    def __str__(self) -> str:
        return f"{self.id}:{self.chain}"


def unhex(chain: Any) -> bytes:
    """A stored ``chain`` as 32 bytes; anything that is not 64 hex digits counts as zeros."""
    if isinstance(chain, str) and len(chain) == 64:
        try:
            return bytes.fromhex(chain)
        except ValueError:
            pass
    return GENESIS


def parse_head(text: str) -> Head:
    """Read a head written as ``ID:HASH`` (``bcpbus audit head``, the head file).

    Raises:
        ValueError: ``text`` is not of that form.
    """
    row, sep, chain = text.strip().partition(":")
    chain = chain.lower()
    if not sep or not row.isdigit() or len(chain) != 64 or unhex(chain) == GENESIS:
        raise ValueError(f"{text!r} is not a head: give ID:HASH as `bcpbus audit head` prints it")
    return Head(int(row), chain)


def payload_of(text: Any) -> dict[str, Any]:
    """A ``payload_json`` value as a dict; ``{}`` for anything that is not a JSON object."""
    try:
        payload = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        payload = None
    return payload if isinstance(payload, dict) else {}


@dataclass(frozen=True)
class Problem:
    """A row that does not verify, and why."""

    row: int | None
    why: str


class SegmentChecks:
    """What a verifier of either chain version finds wrong between rows and segments.

    Both :class:`Verifier` and :class:`~bus.log.chain_v1.LegacyVerifier` keep these attributes and
    report through :meth:`_bad`, so a broken link reads the same whatever version chained it.
    """

    rows: int
    start: int
    problems: list[Problem]
    segments: list[dict[str, Any]]
    _prev_id: Any
    _run: bytes
    _chained: bool

    def _start_links(self) -> None:
        """Start with no row seen: the run at the genesis, nothing chained yet."""
        self._run = GENESIS
        # The last row: its id, its stored chain, and that chain as bytes (what the next row's
        # hash is keyed to).
        self._prev_id = None
        self._prev_stored: str | None = None
        self._prev_digest = GENESIS
        self._chained = False
        self._partial = False

    @property
    def head(self) -> Head | None:
        """The last row's id and ``chain``."""
        if isinstance(self._prev_id, int) and self._prev_stored is not None:
            return Head(self._prev_id, self._prev_stored)
        return None

    def resume(self, prev: tuple[int, str | None] | None) -> None:
        """Check a tail: the next row follows ``prev`` (id and stored ``chain``), or starts a
        segment whose ``previous`` is not checked (``None``)."""
        if prev is not None:
            self._prev_id, self._prev_stored = prev
            self._prev_digest = unhex(self._prev_stored)
        self._chained = True
        self._partial = True
        self._run = self._prev_digest

    @property
    def run(self) -> bytes:
        """The chain over every row so far, as the writer would have stored it."""
        return self._run

    # One row, the same steps for both versions; ``mac`` is the version's hash of a row's
    # content keyed by the hash before it.

    def _index(self, names: Sequence[str]) -> None:
        """Find the columns every version reads in rows whose columns are ``names``."""
        self._names = list(names)
        self._id = self._names.index("id")
        self._chain = self._names.index("chain") if "chain" in self._names else None
        self._event = self._names.index("event")

    def _seen(self, values: Sequence[Any]) -> tuple[Any, Any]:
        """Count a row; return its id and stored ``chain`` (None for a column that is absent)."""
        self.rows += 1
        return values[self._id], values[self._chain] if self._chain is not None else None

    def _starts_segment(self, values: Sequence[Any], stored: Any) -> bool:
        """Whether the row is a ``chain_start`` that was chained (so it starts a segment)."""
        return stored is not None and values[self._event] == CHAIN_START

    def _link(self, row_id: Any, stored: Any, content: bytes, mac: Mac) -> bytes:
        """Check a chained row against the one before it, carry the run on over it, and return
        its hash as it should be."""
        digest = mac(self._prev_digest, content)
        prev_id = self._prev_id
        if stored != digest.hex() or not self._chained or prev_id is None or row_id != prev_id + 1:
            self._link_problem(row_id, stored, prev_id)
        # The run goes on over the rows as they are (what a new segment's "previous" binds).
        same = self._run == self._prev_digest
        self._run = digest if same else mac(self._run, content)
        return digest

    def _moved_on(self, row_id: Any, stored: Any, digest: bytes | None) -> None:
        """Make the row just checked the one the next row links to."""
        self._prev_id, self._prev_stored = row_id, stored
        self._prev_digest = digest if digest and stored == digest.hex() else unhex(stored)

    def _open_segment(
        self, row_id: Any, payload: dict[str, Any], stored: str, expected: bytes, wrong: str | None
    ) -> bytes:
        """Start the segment a ``chain_start`` row opens, and return its hash as it should be:
        report ``wrong`` (what the version finds wrong in the payload) or a hash that does not
        match, else check the rows before it against its ``previous``."""
        if wrong is not None:
            self._bad(row_id, wrong)
        elif stored != expected.hex():
            self._bad(row_id, "it does not match its hash: it was changed or forged")
        elif not self._partial:
            self._check_previous(row_id, payload.get("previous"))
        self._chained = True
        self._run = expected
        return expected

    def _segment_seen(self, row: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """Note a ``chain_start`` row in :attr:`segments`; return its id and payload."""
        payload = payload_of(row.get("payload_json"))
        self.segments.append({"id": row["id"], "ts": row.get("ts"), **payload})
        return row["id"], payload

    def _check_previous(self, row_id: int, previous: Any) -> None:
        before = self.rows - 1
        last_id = self._prev_id
        if not isinstance(previous, dict):
            previous = {}
        rows, chain = previous.get("rows", 0), previous.get("chain")
        if rows != before or previous.get("last_id") != last_id:
            self._bad(
                row_id,
                f"it starts a segment after {rows} rows (the last {previous.get('last_id')}), but "
                f"{before} rows (the last {last_id}) come before it: rows before it were added or "
                "removed since",
            )
        elif before and chain != self._run.hex():
            self._bad(row_id, "rows before it were changed or reordered since its segment started")

    def _link_problem(self, row_id: Any, stored: str | None, prev_id: Any) -> None:
        if stored is None:
            self._bad(row_id, "it has no hash: it was inserted by something other than the log")
        elif not self._chained:
            self._bad(
                row_id, "no chain_start row comes before it: the start of the log was removed"
            )
        elif isinstance(prev_id, int) and isinstance(row_id, int) and row_id > prev_id + 1:
            gap = prev_id + 1 if row_id == prev_id + 2 else f"{prev_id + 1}-{row_id - 1}"
            self._bad(row_id, f"row {gap} before it is missing: removed")
        elif isinstance(prev_id, int) and row_id != prev_id + 1:
            self._bad(row_id, f"it follows row {prev_id}: the ids were changed")
        else:
            self._bad(
                row_id,
                "it does not match its hash: it was changed, forged, or the rows before it were "
                "replaced",
            )

    def _bad(self, row_id: Any, why: str) -> None:
        if isinstance(row_id, int) and row_id < self.start:
            return
        self.problems.append(Problem(row_id if isinstance(row_id, int) else None, why))
