"""The activity log's hash chain: each row hashed with the one before it, so a rewrite shows.

Every row carries ``chain``, the hex SHA-256 of the previous row's ``chain`` (32 bytes) followed
by the row's own canonical content. A ``chain_start`` row begins a segment: it is hashed with 32
zero bytes instead, and its payload binds everything before it (see :class:`Verifier`).

Why a plain hash and no key (version :data:`VERSION`). Version 1 (:mod:`bus.log.chain_v1`) chained
with an HMAC under a key kept beside the database: whoever could verify the log could also
re-chain a forged one (the key is symmetric), and the key usually lay where the database's owner
could read it. Now the chain is something anyone can recompute from the rows, and authenticity
comes from elsewhere: the bus signs the head with an Ed25519 key as it goes, in a checkpoint
(:mod:`bus.log.checkpoints`, the C2SP signed-note format transparency logs use), and keeps the
checkpoints outside the database. An auditor checks rows, chain and signatures with the public
key alone, and cannot forge what they check; a forger who re-chains the rows with everything an
auditor has (the database, the public key, even a version-1 key) produces heads no checkpoint
signed. What the chain alone still gives: a row changed, added, removed or reordered without
re-chaining the rest is named by :class:`Verifier`; what it cannot give is the tail after the
last checkpoint (rows written since are chained but not yet signed) and a log re-chained as a
whole, which only the checkpoints catch. An HMAC alongside would close the first for a forger
without the key, at a second hash per row on the writer's path; the checkpoints every
``head_every_rows`` rows and seconds, and at every clean shutdown, bound that window instead.

The canonical content (version :data:`VERSION`) of a row is, for each column but ``chain`` whose
value is not NULL, in the order of the column names: the name, a NUL, the value's storage class
as one letter (``i`` integer, ``r`` real, ``t`` text), the length of the value's text in Unicode
code points in decimal, a NUL, and the value's text (an integer in decimal, a real as Python's
``repr``: the shortest text that reads back the same double); all of it UTF-8. The class letter
is what version 1 lacked: an integer ``epoch`` rewritten as the text ``'5'`` (a table rebuilt
with another column type) hashed alike. The lengths make it unambiguous whatever the values
hold; leaving NULLs out is what lets a column be added later: the rows written before it read
NULL there, and hash as they did. The writer knows every value as text (SQLite turns the decimal
text of :data:`INTEGER_COLUMNS` into integers), so it encodes a row in one pass over strings.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .chain_v1 import LegacyVerifier

# Shared with version 1, which builds on them too; importable from here, where they always were.
from .segments import (
    CHAIN_START,
    GENESIS,
    Head,
    Problem,
    SegmentChecks,
    parse_head,
    payload_of,
    unhex,
)

__all__ = [
    "CHAIN_START",
    "GENESIS",
    "INTEGER_COLUMNS",
    "VERSION",
    "ChainBroken",
    "Chainer",
    "Head",
    "Problem",
    "Verifier",
    "canonical_row",
    "parse_head",
    "payload_of",
]

logger = logging.getLogger("bus.log.activity")

VERSION = 2
"""The canonical encoding and chaining rule a ``chain_start`` row declares (``"chain": 2``)."""

INTEGER_COLUMNS = frozenset({"id", "epoch"})
"""The columns ``bus.log.schema.SCHEMA`` declares ``INTEGER`` (tests/bus/test_chain.py checks)."""


class ChainBroken(ValueError):
    """The log's chain or triggers show a change: the one-line message names the first bad row.

    Attributes:
        row: the id of the first row found bad, or None when only a trigger is missing.
        why: what is wrong with it.
    """

    def __init__(self, path: str | os.PathLike[str], row: int | None, why: str) -> None:
        self.path = str(path)
        self.row = row
        self.why = why
        super().__init__(self.path, row, why)

    def __str__(self) -> str:
        where = f"row {self.row}: " if self.row is not None else ""
        return (
            f"activity log {self.path}: {where}{self.why}; check it with `bcpbus audit verify "
            f"--db {self.path}`, or start with --accept-broken-log to record the break and start "
            "a new chain segment"
        )


# Rows


Fields = list[tuple[str, int, str]]
"""The chained columns of a row layout: each name with its index and the class letter the writer
gives its text, in name order."""


def fields_of(names: Sequence[str]) -> Fields:
    """The :data:`Fields` of rows whose columns are ``names`` (``chain`` is left out)."""
    return sorted(
        (name, i, "i" if name in INTEGER_COLUMNS else "t")
        for i, name in enumerate(names)
        if name != "chain"
    )


def _typed(name: str, value: Any) -> str:
    """One column of the canonical content, for a value that is not text."""
    if value.__class__ is int:
        text = str(value)
        return f"{name}\0i{len(text)}\0{text}"
    if value.__class__ is float:
        text = repr(value)
        return f"{name}\0r{len(text)}\0{text}"
    raise TypeError(f"a chained column holds {type(value).__name__}, not text or a number")


def encode_row(fields: Fields, values: Sequence[Any]) -> bytes:
    """The canonical content of a row the writer is about to insert: its text values take the
    class their column stores them as (integer for :data:`INTEGER_COLUMNS`, text otherwise).

    Raises:
        TypeError: a value is neither text nor a number (a BLOB).
        UnicodeEncodeError: a value is not valid Unicode (SQLite would refuse it too).
    """
    try:
        # The writer's case, every value text: one pass, no conversions.
        text = "".join(
            [
                f"{name}\0{tag}{len(v)}\0{v}"
                for name, i, tag in fields
                if (v := values[i]) is not None
            ]
        )
    except TypeError:  # a number: len() of it fails
        text = "".join(
            [
                f"{name}\0{tag}{len(v)}\0{v}" if v.__class__ is str else _typed(name, v)
                for name, i, tag in fields
                if (v := values[i]) is not None
            ]
        )
    return text.encode()


def encode_stored(fields: Fields, values: Sequence[Any]) -> bytes:
    """The canonical content of a row as SQLite returned it: each value's class is its own.

    Raises:
        TypeError: a value is neither text nor a number (a BLOB).
        UnicodeEncodeError: a value is not valid Unicode.
    """
    return "".join(
        [
            f"{name}\0t{len(v)}\0{v}" if v.__class__ is str else _typed(name, v)
            for name, i, _ in fields
            if (v := values[i]) is not None
        ]
    ).encode()


def canonical_row(row: Mapping[str, Any]) -> bytes:
    """The canonical content of ``row``, a mapping of column to value as stored (``chain`` left
    out)."""
    names = list(row)
    return encode_stored(fields_of(names), [row[name] for name in names])


def _sha256(prev: bytes, content: bytes) -> bytes:
    return hashlib.sha256(prev + content).digest()


class Chainer:
    """Chains rows for the writer: ``ids`` and ``chain`` for a batch after the log's last row.

    Args:
        columns: the columns the writer fills, in the order of its rows (``id`` and ``chain``
            excluded).
    """

    def __init__(self, columns: Sequence[str]) -> None:
        self._fields = fields_of(["id", *columns])

    def link(
        self, rows: Iterable[Sequence[Any]], last_id: int, last_chain: Any
    ) -> tuple[list[Any], int, str]:
        """Return the INSERT parameters ``(id, *row, chain)`` of ``rows``, and the new head.

        Raises:
            UnicodeEncodeError, TypeError: as :func:`encode_row`.
        """
        prev = unhex(last_chain)
        fields, sha256 = self._fields, hashlib.sha256
        params: list[Any] = []
        row_id, hexed = last_id, str(last_chain)
        for row in rows:
            row_id += 1
            prev = sha256(prev + encode_row(fields, (str(row_id), *row))).digest()
            hexed = prev.hex()
            params.append(row_id)
            params.extend(row)
            params.append(hexed)
        return params, row_id, hexed

    def start(self, row: Sequence[Any], row_id: int) -> tuple[list[Any], str]:
        """Return the INSERT parameters of a ``chain_start`` row and its hash."""
        hexed = _sha256(GENESIS, encode_row(self._fields, (str(row_id), *row))).hex()
        return [row_id, *row, hexed], hexed


# Verification


@dataclass
class Verifier(SegmentChecks):
    """Check rows, oldest first, against the chain; collect what does not match.

    Feed every row (id order) to :meth:`check` as a mapping of column to value; then
    :attr:`problems` holds what is wrong, first first. Rows before the first version-2
    ``chain_start`` were written before the log was chained, or chained by version 1: the
    ``chain_start`` that follows them binds them (its payload's ``previous``), so they are
    checked too, as a whole; with ``legacy_key`` (the version-1 key) each version-1 row is
    checked as well (:class:`~bus.log.chain_v1.LegacyVerifier`).

    ``previous`` in a ``chain_start`` payload is ``{"rows", "last_id", "chain"}``: how many rows
    came before it, the last one's id, and the hex :attr:`run` over them (the chain as it would
    be had every row been chained, each segment from its ``chain_start``), as they were when the
    segment started.

    Args:
        legacy_key: the version-1 key, to check the rows a version-1 log chained; None to
            count them in :attr:`legacy_unchecked` instead.
        start: report nothing wrong before this row id (a segment's ``chain_start``), but still
            check that its ``previous`` matches the rows before it.
    """

    legacy_key: bytes | None = None
    start: int = 0
    problems: list[Problem] = field(default_factory=list)
    rows: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    """The ``chain_start`` rows seen: id, ts, and their payload."""
    legacy_rows: int = 0
    """Rows chained by version 1 (before the first version-2 ``chain_start``)."""
    legacy_unchecked: int = 0
    """Of those, the rows not checked one by one (no ``legacy_key``)."""

    def __post_init__(self) -> None:
        self._legacy: LegacyVerifier | None = None
        if self.legacy_key is not None:
            self._legacy = LegacyVerifier(self.legacy_key, self.start)
        self._in_legacy = False
        self._start_links()

    @property
    def chained(self) -> bool:
        """Whether a version-2 ``chain_start`` was seen (or the check resumed after one)."""
        return self._chained

    def columns(self, names: Sequence[str]) -> None:
        """Say which columns the rows given to :meth:`check` have, in their order."""
        self._fields = fields_of(names)
        self._index(names)
        self._ts = self._names.index("ts")
        self._payload = self._names.index("payload_json")
        if self._legacy is not None:
            self._legacy.columns(names)

    def check(self, values: Sequence[Any]) -> None:
        """Check one row, its ``values`` in the order :meth:`columns` gave."""
        row_id, stored = self._seen(values)
        content = self._content(row_id, values)
        digest: bytes | None = None
        if not self._chained and self._before_chain(values, stored):
            self._run = _sha256(self._run, content)
        elif self._starts_segment(values, stored):
            digest = self._segment(dict(zip(self._names, values, strict=True)), content, stored)
        else:
            digest = self._link(row_id, stored, content, _sha256)
        self._moved_on(row_id, stored, digest)

    def _before_chain(self, values: Sequence[Any], stored: Any) -> bool:
        """Whether a row met before any version-2 ``chain_start`` is one of the rows it binds:
        unchained, or chained by version 1 (checked by the legacy verifier when there is one)."""
        if self._starts_segment(values, stored):
            payload = payload_of(values[self._payload])
            if payload.get("chain") != 1:
                return False  # a segment of this version (or an unknown one) starts
            self._in_legacy = True
            self.segments.append({"id": values[self._id], "ts": values[self._ts], **payload})
        elif stored is not None and not self._in_legacy:
            return False  # chained, but nothing started the chain
        if stored is not None:
            self.legacy_rows += 1
            self.legacy_unchecked += self._legacy is None
        if self._legacy is not None:
            known = len(self._legacy.problems)
            self._legacy.check(values)
            self.problems.extend(self._legacy.problems[known:])
        return True

    def _content(self, row_id: Any, values: Sequence[Any]) -> bytes:
        try:
            # A BLOB cannot be encoded: no row the writer hashed holds one.
            return encode_stored(self._fields, values)
        except (TypeError, UnicodeEncodeError) as exc:
            self._bad(row_id, f"it holds what the writer never stores ({exc})")
            return repr(list(values)).encode("utf-8", "replace")

    def _segment(self, row: dict[str, Any], content: bytes, stored: str) -> bytes:
        row_id, payload = self._segment_seen(row)
        wrong = None
        if payload.get("chain") != VERSION:
            wrong = (
                f"it starts a chain of version {payload.get('chain')!r} after rows of version "
                f"{VERSION}: it was forged, or written by another program"
            )
        return self._open_segment(row_id, payload, stored, _sha256(GENESIS, content), wrong)
