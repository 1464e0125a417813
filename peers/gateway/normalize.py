"""Normalization of BCP text answers: the canonical form a controller receives.

BCP §"Hidden Channel Mitigations": a reader could encode bits in field order, capitalization,
whitespace and punctuation, or in characters nobody sees. The controller therefore never gets the
raw text, only its canonical form, built in this order:

1. every whitespace character becomes a space; invisible characters (:func:`is_invisible`:
   zero-width, bidi and other format characters, controls, tag characters, variation selectors,
   private-use, unassigned) are removed;
2. Unicode NFKC, which folds compatibility forms (fullwidth letters, ligatures, styled
   mathematical letters) into plain ones;
3. lowercase, where the spec asks for it;
4. runs of whitespace collapse to one space; leading and trailing whitespace go.

The steps repeat until the text no longer changes (NFKC can uncover what step 1 removes and the
reverse), so :func:`normalize_text` is idempotent. Format-specific canonical forms
(:func:`canonicalize`) come on top: ``yes_no`` and ``email`` answers are lowercased, numbers lose
their sign and zero padding, list items are rejoined with ``", "``.

A *word* is a whitespace-separated token of the normalized text: :func:`count_words`. Word
limits, and so the 11 bits charged per word, are counted on the text the controller receives.

Everything here is a pure, total function of ``str``: no I/O, never raises on any string.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from schemas.bcp import ExpectedFormat, Question

__all__ = [
    "BIDI_CONTROLS",
    "canonicalize",
    "count_words",
    "is_invisible",
    "normalize_answer",
    "normalize_summary",
    "normalize_text",
]

BIDI_CONTROLS: Final = frozenset(
    chr(c)
    for c in (
        *range(0x202A, 0x202F),  # LRE, RLE, PDF, LRO, RLO
        *range(0x2066, 0x206A),  # LRI, RLI, FSI, PDI
        0x200E,  # LRM
        0x200F,  # RLM
        0x061C,  # ARABIC LETTER MARK
    )
)
"""Bidirectional controls: they reorder what a human reviewer sees (CVE-2021-42574)."""

# Format (zero-width, bidi, tags U+E0000-U+E007F), control, surrogate, private-use, unassigned.
_INVISIBLE_CATEGORIES: Final = frozenset({"Cf", "Cc", "Cs", "Co", "Cn"})

# Visible-by-category characters that render as nothing.
_INVISIBLE_EXTRA: Final = frozenset(
    chr(c)
    for c in (
        0x034F,  # COMBINING GRAPHEME JOINER
        0x115F,  # HANGUL CHOSEONG FILLER
        0x1160,  # HANGUL JUNGSEONG FILLER
        0x17B4,  # KHMER VOWEL INHERENT AQ
        0x17B5,  # KHMER VOWEL INHERENT AA
        *range(0x180B, 0x1810),  # MONGOLIAN FREE VARIATION SELECTORS, VOWEL SEPARATOR
        0x2800,  # BRAILLE PATTERN BLANK
        0x3164,  # HANGUL FILLER
        0xFFA0,  # HALFWIDTH HANGUL FILLER
        *range(0xFE00, 0xFE10),  # VARIATION SELECTOR-1..16
        *range(0xE0100, 0xE01F0),  # VARIATION SELECTOR-17..256
    )
)

# The same set as a character class, for a fast search (test_normalize checks they agree).
_EXTRA_SEARCH: Final = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\uffa0\ufe00-\ufe0f"
    "\U000e0100-\U000e01ef]"
).search

# Fixed-point rounds of normalize_text; real text settles in one or two.
_MAX_ROUNDS: Final = 4

_INTEGER = re.compile(r"([+-]?)([0-9]+)")
_NUMBER = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?")


def is_invisible(char: str) -> bool:
    """Return whether normalization removes ``char`` (one character) as invisible.

    Whitespace is not invisible: it becomes a space. Bidi controls (:data:`BIDI_CONTROLS`) are.
    """
    if char.isspace():
        return False
    return char in _INVISIBLE_EXTRA or unicodedata.category(char) in _INVISIBLE_CATEGORIES


def _clean(text: str) -> str:
    # str.isprintable() is false exactly for the categories Other (Cc, Cf, Cs, Co, Cn) and
    # Separator (Zs, Zl, Zp) but the space: printable text without the extras needs no walk.
    if text.isprintable() and not _EXTRA_SEARCH(text):
        return text
    return "".join(" " if c.isspace() else c for c in text if not is_invisible(c))


def _round(text: str, lowercase: bool) -> str:
    text = unicodedata.normalize("NFKC", _clean(text))
    text = _clean(text)
    if lowercase:
        text = text.lower()
    return " ".join(text.split())


def normalize_text(text: str, *, lowercase: bool = False) -> str:
    """Return the canonical form of ``text``: cleaned, NFKC, optionally lowercased, collapsed.

    Args:
        text: any string, including one with lone surrogates or control characters.
        lowercase: lowercase the result (a question's ``lowercase: true``).

    Returns:
        The normalized text; ``normalize_text(result, lowercase=lowercase) == result``.
        Bound the input's length first: NFKC may expand a character up to 18 times.
    """
    for _ in range(_MAX_ROUNDS):  # pragma: no branch - text settles in two rounds; this caps it
        result = _round(text, lowercase)
        if result == text:
            break
        text = result
    return text


def count_words(text: str) -> int:
    """Return the number of words of normalized ``text``: its whitespace-separated tokens."""
    return len(text.split())


def canonicalize(text: str, expected_format: ExpectedFormat) -> str:
    """Return the canonical form of normalized ``text`` for an ``expected_format``.

    Total: text that does not have the format comes back unchanged, and validation then rejects
    it. ``yes_no`` and ``email`` are lowercased (a trailing period after yes/no goes);
    ``integer`` and ``number`` lose ``+``, zero padding and trailing fraction zeros (``-0`` is
    ``0``); ``short_list`` items are trimmed, empty ones dropped, the rest joined with ``", "``.
    Other formats are returned as they are.

    Args:
        text: the output of :func:`normalize_text`.
        expected_format: the question's format.
    """
    if expected_format in ("email", "yes_no"):
        text = normalize_text(text, lowercase=True)
        if expected_format == "yes_no" and text in ("yes.", "no."):
            text = text[:-1]
        return text
    if expected_format == "integer":
        if match := _INTEGER.fullmatch(text):
            return _signed(match[1], match[2].lstrip("0") or "0")
        return text
    if expected_format == "number":
        match = _NUMBER.fullmatch(text)
        if match and (match[2] or match[3]):
            whole = match[2].lstrip("0") or "0"
            fraction = (match[3] or "").rstrip("0")
            return _signed(match[1], f"{whole}.{fraction}" if fraction else whole)
        return text
    if expected_format == "short_list":
        items = (item.strip() for item in text.split(","))
        return ", ".join(item for item in items if item)
    return text


def _signed(sign: str, magnitude: str) -> str:
    return f"-{magnitude}" if sign == "-" and magnitude != "0" else magnitude


def normalize_answer(raw: str, question: Question) -> str:
    """Return what the controller receives for ``raw``, the reader's answer to ``question``.

    Args:
        raw: the reader's answer; bound its length first (see :func:`normalize_text`).
        question: the Cat-2 question, for ``lowercase`` and ``expected_format``.

    Returns:
        ``canonicalize(normalize_text(raw, lowercase=...), expected_format)``; idempotent.
    """
    text = normalize_text(raw, lowercase=bool(question.lowercase))
    return canonicalize(text, question.expected_format)


def normalize_summary(raw: str) -> str:
    """Return what the controller receives for ``raw``, a Cat-3 summary."""
    return normalize_text(raw)
