"""Bandwidth accounting of BCP: what a spec is charged, and what an answer can carry at most.

**The charge.** BCP §"Bandwidth Accounting": a boolean is 1 bit, an enum of N values log2(N)
bits, an integer in ``[min, max]`` log2(max - min + 1) bits, and text 11 bits per allowed word
(roughly the entropy of an English word). A spec's charge (:func:`spec_bits`) is the sum over its
fields or questions, plus a Cat-2 spec's short-answer allowance when its free text allows fewer
than 14 words (:func:`short_answer_allowance`); a Cat-3 summary costs its ``max_words``. A
``date`` question is charged at least :data:`DATE_BITS` (21.8), because any of the 3,652,059
dates from 0001-01-01 to 9999-12-31 is one word. The gateway charges this before the reader is
asked (a query) or before the answer is delivered (a subscription publish).

**The capacity.** 11 bits per word is an average, not a bound: a reader choosing its words freely
could pick 64-character words of any script. So every text answer is also measured
(:func:`answer_bits`) under a prefix code of the text the controller receives, and validation
refuses an answer whose capacity exceeds its charge. The code makes the bound hold: its lengths
satisfy Kraft's inequality (the sum of 2^-bits over all values is at most 1), so at most 2^B
distinct values measure B bits or less, and a reader that may send any value within the charge
chooses among at most 2^charge of them. The code, for normalized text of n <= W words:

- log2(W) bits for n, then each word (a whitespace-separated token) as an opening mark, a core
  and a closing mark, each from a small table of probabilities (``_OPEN``, ``_CORE``,
  ``_CLOSE``). A core is the cheapest that fits of: a word of :data:`VOCABULARY` in lowercase,
  Capitalized or UPPERCASE, log2(r) + log2(H) bits for rank r (H = 1 + 1/2 + ... + 1/V, a Zipf
  distribution; "the" costs about 4 bits, a rank-10,000 word about 17); ASCII digits; a
  vocabulary word with combining marks; Latin letters spelled out (each given the one before, by
  a letter-pair model of the vocabulary's spellings); or a run of pieces (words,
  letters, digits, ASCII punctuation, a run of one ASCII mark, or one other character of the
  field's alphabet at log2 of its size) closed by an end mark. Counts are in Elias gamma code.
- A ``yes_no`` answer is 1 bit, a ``date`` :data:`DATE_BITS`, an ``integer`` or ``number`` a
  sign, then its digits with their counts.

docs/bcp.md §"What an answer can carry" has the tables and what they cost ordinary answers.

Each field has an alphabet (:data:`ENGLISH`, :data:`NAMES`): text with a character outside it is
refused by validation, not charged. Examples from the BCP specifications: the Cat-1 example costs
1 + log2(3) + log2(5) + 2 = 6.907 bits; the ``research-findings`` subscription (questions of 10,
50 and 1 words) costs 11 x 61 = 671.0 bits, and an answer to it may carry up to that.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Final

from schemas.bcp import (
    AnomalyCode,
    ExpectedFormat,
    NormalizedValue,
    QuerySpec,
    Question,
    SpecField,
)

__all__ = [
    "ALLOWANCE_UNTIL",
    "ALLOWANCE_WORDS",
    "BITS_PER_WORD",
    "CEILING_BITS_PER_WORD",
    "CEILING_BITS_PER_QUESTION",
    "DATE_BITS",
    "ENGLISH",
    "NAMES",
    "TEXT_FORMATS",
    "VOCABULARY",
    "Alphabet",
    "alphabet_of",
    "answer_bits",
    "delivered_spec_bits",
    "facts_bits",
    "field_bits",
    "findings_bits",
    "foreign_char",
    "question_bits",
    "question_ceiling",
    "short_answer_allowance",
    "spec_bits",
    "spec_ceiling",
    "text_bits",
    "value_bits",
    "vocabulary_rank",
    "word_bits",
]

BITS_PER_WORD: Final = 11
"""BCP: "Constrained text (W words): ~W x 11 bits"."""

DATE_BITS: Final = math.log2(3_652_059)
"""log2 of the dates from 0001-01-01 to 9999-12-31: what any one ``date`` answer carries."""

VOCABULARY: Final = "vocabulary.txt"
"""The shipped word list beside this module: 32,768 English words, most frequent first."""


@dataclass(frozen=True, slots=True)
class Alphabet:
    """The characters a text field allows beyond printable ASCII, and what one of them costs.

    ASCII letters, digits and punctuation are always allowed; :attr:`ranges` add the rest.
    """

    name: str
    ranges: tuple[tuple[int, int], ...]
    """Inclusive code point ranges of the other characters allowed."""

    @property
    def char_bits(self) -> float:
        """Return log2 of how many other characters there are: the bits of one of them."""
        return math.log2(sum(high - low + 1 for low, high in self.ranges))

    def allows(self, char: str) -> bool:
        """Return whether ``char`` (one character) may appear in the field."""
        code = ord(char)
        return 0x21 <= code <= 0x7E or any(low <= code <= high for low, high in self.ranges)


ENGLISH: Final = Alphabet(
    "Latin and Greek letters, punctuation and common symbols",
    (
        (0x00A1, 0x024F),  # Latin-1 Supplement, Latin Extended-A and -B: é, ñ, ß, °, ±, £
        (0x0370, 0x03FF),  # Greek: α-synuclein, TNF-α, μ
        (0x1E00, 0x1EFF),  # Latin Extended Additional: Vietnamese names
        (0x2010, 0x205E),  # General Punctuation: dashes, quotes, bullet, per mille, prime
        (0x20A0, 0x20C0),  # Currency Symbols: €, ₹
        (0x2100, 0x214F),  # Letterlike Symbols: ™, ℃ that NFKC keeps
        (0x2190, 0x22FF),  # Arrows and Mathematical Operators: →, ≤, ≈, ×
    ),
)
"""The alphabet of ``short_text``, ``short_list``, ``email`` and Cat-3 summaries: an English
answer may name Zoë, cost €5 or concern α-synuclein, but not switch script."""

NAMES: Final = Alphabet("any character", ((0x80, 0x10FFFF),))
"""The alphabet of ``person_name``: letters of every script (the format checks they are
letters), each charged as if it were any of the 1,114,000 code points above ASCII."""

_ASCII_PUNCTUATION: Final = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_PIECE: Final = re.compile(r"[A-Za-z\u00c0-\u024f]+|[0-9]+|([!-/:-@\[-`{-~])\1+|.", re.DOTALL)
# A run of one ASCII mark ("=====", "__", "...") is one piece: headings' rules and dunder names
# would otherwise cost 8 bits a character.
# Latin letters beyond ASCII (Latin-1 Supplement to Latin Extended-B, with the signs × and ÷,
# which cost the same as a letter here): they spell names such as Zoë, Saldaña or Dvořák.
_LATIN_EXTRA: Final = 0x024F - 0x00C0 + 1
_INTEGER: Final = re.compile(r"-?([0-9]+)")
_NUMBER: Final = re.compile(r"-?([0-9]+)(?:\.([0-9]+))?")


def _cost(probability: float) -> float:
    return -math.log2(probability)


# The code's probabilities; each table sums to 1. A word is an opening mark, a core and a closing
# mark; the core is a vocabulary word in one of three cases, ASCII digits, an accented vocabulary
# word, Latin letters spelled out, or a run of pieces.
_OPEN: Final = {"": _cost(0.97), **dict.fromkeys("(\"'[", _cost(0.0075))}
_CLOSE: Final = {
    "": _cost(0.78),
    ",": _cost(0.08),
    ".": _cost(0.06),
    "'s": _cost(0.02),
    **dict.fromkeys((")", ";", ":", "%"), _cost(0.01)),
    **dict.fromkeys(("),", ").", '"', "?", "!", "'"), _cost(0.04 / 6)),
}
_CORE: Final = {"lower": _cost(0.72), "title": _cost(0.10), "upper": _cost(0.03)}
_CORE_DIGITS: Final = _cost(0.06)
_CORE_ACCENTED: Final = _cost(0.02)
_CORE_SPELLED: Final = _cost(0.04)
_CORE_RUN: Final = _cost(0.03)
# An accented vocabulary word (José, Karikó): the word, then each combining mark and where it is.
_COMBINING_MARKS: Final = 0x036F - 0x0300 + 1
# Piece level, inside a run (each step picks one; END closes the run).
_PIECE_WORD: Final = _cost(0.25)
_PIECE_LETTERS: Final = _cost(0.10)
_PIECE_DIGITS: Final = _cost(0.15)
_PIECE_PUNCT: Final = _cost(0.12)
_PIECE_REPEAT: Final = _cost(0.03)
_PIECE_OTHER: Final = _cost(0.05)
_PIECE_END: Final = _cost(0.30)
# A letter spelled out: ASCII, or one of the Latin letters beyond it.
_ASCII_LETTER: Final = _cost(0.97)
_EXTRA_LETTER: Final = _cost(0.03)
# The case of a vocabulary word inside a run.
_RUN_CASE: Final = {"lower": _cost(0.6), "title": _cost(0.3), "upper": _cost(0.1)}
# The case of letters spelled out; "mixed" (mRNA) then costs one bit a letter.
_SPELL_CASE: Final = {
    "lower": _cost(0.55),
    "title": _cost(0.3),
    "upper": _cost(0.1),
    "mixed": _cost(0.05),
}
_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz"
_END_OF_WORD: Final = "$"


@cache
def _ranks() -> dict[str, int]:
    text = resources.files("peers.gateway").joinpath(VOCABULARY).read_text(encoding="utf-8")
    words = (line for line in text.splitlines() if line and not line.startswith("#"))
    return {word: rank for rank, word in enumerate(words, start=1)}


@cache
def _zipf_norm() -> float:
    return math.log2(math.fsum(1 / rank for rank in range(1, len(_ranks()) + 1)))


def vocabulary_rank(word: str) -> int | None:
    """Return the rank of lowercase ``word`` in :data:`VOCABULARY` (1 is "the"), or ``None``."""
    return _ranks().get(word)


def _rank_bits(word: str) -> float | None:
    rank = _ranks().get(word.lower())
    return None if rank is None else math.log2(rank) + _zipf_norm()


def _case(letters: str) -> str | None:
    if letters.islower():
        return "lower"
    if letters[0].isupper() and (len(letters) == 1 or letters[1:].islower()):
        return "title"
    return "upper" if letters.isupper() else None


def _gamma(length: int) -> int:
    """Elias gamma: the bits that say a count >= 1."""
    return 2 * (length.bit_length() - 1) + 1


def _letters_bits(letters: str) -> float:
    spelled = _PIECE_LETTERS + _spelled_bits(letters)
    rank_bits = _rank_bits(letters) if letters.isascii() else None
    case = _case(letters)
    if rank_bits is None or case is None:
        return spelled
    return min(spelled, _PIECE_WORD + _RUN_CASE[case] + rank_bits)


def word_bits(word: str, alphabet: Alphabet = ENGLISH) -> float:
    """Return the bits of one normalized word (no whitespace) in a field of ``alphabet``.

    Returns:
        The cheapest of the word's codes (an opening mark, a core, a closing mark);
        ``math.inf`` if it has a character ``alphabet`` does not allow.
    """
    best = math.inf
    for open_mark in ("", word[0]) if word[0] in _OPEN else ("",):
        for close_mark in _closings(word, len(open_mark)):
            core = word[len(open_mark) : len(word) - len(close_mark)]
            marks = _OPEN[open_mark] + _CLOSE[close_mark]
            best = min(best, marks + _core_bits(core, alphabet))
    return best


def _closings(word: str, start: int) -> list[str]:
    return [mark for mark in _CLOSE if word.endswith(mark) and len(word) - len(mark) > start]


def _core_bits(core: str, alphabet: Alphabet) -> float:
    run = _CORE_RUN + _run_bits(core, alphabet)
    if core.isascii() and core.isdigit():
        return min(run, _CORE_DIGITS + _digits_bits(core))
    if core.isascii() and core.isalpha():
        rank_bits, case = _rank_bits(core), _case(core)
        if rank_bits is not None and case is not None:
            return min(run, _CORE[case] + rank_bits)
    elif (accented := _accented_bits(core)) is not None:
        run = min(run, accented)
    if _is_letters(core) and _PIECE.fullmatch(core):
        run = min(run, _CORE_SPELLED + _spelled_bits(core))
    return run


def _spelled_bits(letters: str) -> float:
    """Latin letters spelled out: their case, then each letter given the one before, then
    the end (:func:`_letter_costs`); a letter beyond ASCII at a flat cost."""
    case = _case(letters)
    bits = _SPELL_CASE[case] if case is not None else _SPELL_CASE["mixed"] + len(letters)
    costs = _letter_costs()
    previous = "^"
    for char in letters.lower():
        if char in costs:
            bits += _ASCII_LETTER + costs[previous][char]
            previous = char
        else:
            bits += _EXTRA_LETTER + math.log2(_LATIN_EXTRA)
            previous = "?"
    return bits + _ASCII_LETTER + costs[previous][_END_OF_WORD]


@cache
def _letter_costs() -> dict[str, dict[str, float]]:
    """The bits of each letter a-z, and of the end of the word, after the letter before.

    A letter bigram model of the vocabulary's spellings (each word counted once, every count
    plus one half): "^" is the start of a word, which cannot end there; "?" follows a letter
    beyond ASCII and is the letters' overall distribution. Names the vocabulary lacks (Nadella,
    Kowalski) cost about 3.5 bits a letter this way rather than the 4.7 of any of 26.
    """
    symbols = [*_ALPHABET, _END_OF_WORD]
    counts = {previous: dict.fromkeys(symbols, 0.5) for previous in ("^", "?", *_ALPHABET)}
    del counts["^"][_END_OF_WORD]
    for word in _ranks():
        previous = "^"
        for char in word:
            counts[previous][char] += 1
            counts["?"][char] += 1
            previous = char
        counts[previous][_END_OF_WORD] += 1
        counts["?"][_END_OF_WORD] += 1
    costs: dict[str, dict[str, float]] = {}
    for previous, row in counts.items():
        total = math.fsum(row.values())
        costs[previous] = {char: -math.log2(count / total) for char, count in row.items()}
    return costs


def _accented_bits(core: str) -> float | None:
    """The bits of a vocabulary word with combining marks on its letters, or ``None``."""
    base: list[str] = []
    marks = 0
    for char in unicodedata.normalize("NFD", core):
        if 0x0300 <= ord(char) <= 0x036F and base:
            marks += 1
        elif char.isascii() and char.isalpha():
            base.append(char)
        else:
            return None
    word = "".join(base)
    rank_bits, case = _rank_bits(word), _case(word)
    if rank_bits is None or case is None or marks == 0:
        return None
    each = math.log2(len(word)) + math.log2(_COMBINING_MARKS)
    return _CORE_ACCENTED + _RUN_CASE[case] + rank_bits + _gamma(marks) + marks * each


def _is_letters(piece: str) -> bool:
    # A piece is one class of _PIECE: its first character tells which.
    first = piece[0]
    return (first.isascii() and first.isalpha()) or 0xC0 <= ord(first) <= 0x24F


def _run_bits(run: str, alphabet: Alphabet) -> float:
    bits = _PIECE_END
    for match in _PIECE.finditer(run):
        piece = match[0]
        if _is_letters(piece):
            bits += _letters_bits(piece)
        elif piece.isascii() and piece.isdigit():
            bits += _PIECE_DIGITS + _digits_bits(piece)
        elif piece in _ASCII_PUNCTUATION:
            bits += _PIECE_PUNCT + math.log2(len(_ASCII_PUNCTUATION))
        elif piece[0] in _ASCII_PUNCTUATION:  # a run of one mark: which, then how many more
            bits += _PIECE_REPEAT + math.log2(len(_ASCII_PUNCTUATION)) + _gamma(len(piece) - 1)
        elif alphabet.allows(piece):
            bits += _PIECE_OTHER + alphabet.char_bits
        else:
            return math.inf
    return bits


def text_bits(max_words: int) -> float:
    """Return the charge of a text answer of at most ``max_words`` words: 11 per word."""
    return float(BITS_PER_WORD * max_words)


def field_bits(field: SpecField) -> float:
    """Return the bits of one Cat-1 field: 1, log2(len(values)) or log2(max - min + 1).

    A one-value enum or a one-value range carries nothing and costs 0.0.
    """
    if field.type == "boolean":
        return 1.0
    if field.type == "enum":
        return math.log2(len(field.values)) if field.values else 0.0
    low, high = field.bounds()
    return math.log2(high - low + 1)


def question_bits(question: Question) -> float:
    """Return the charge of one Cat-2 question: 11 per word, and a date at least DATE_BITS.

    A ``same_as`` question is charged in full: its answer must agree with another, but agreement
    is checked after normalization, so the reader still chooses its text.
    """
    bits = text_bits(question.max_words)
    return max(bits, DATE_BITS) if question.expected_format == "date" else bits


TEXT_FORMATS: Final = frozenset({"short_text", "short_list", "person_name", "email"})
"""The formats whose answers are free text in an alphabet, measured word by word."""

ALLOWANCE_WORDS: Final = 4
"""The short-answer allowance of a Cat-2 spec at most: 4 words' worth, 44 bits."""

ALLOWANCE_UNTIL: Final = 14
"""The allowance shrinks as the spec's text questions allow more words, and is gone at 14."""


def short_answer_allowance(questions: Sequence[Question]) -> float:
    """Return the bits a Cat-2 spec is charged beyond 11 a word: 11 x min(4, 14 - N), at least 0.

    N is the total ``max_words`` of the spec's free-text questions (:data:`TEXT_FORMATS`).
    11 bits a word is what running English prose carries; a short factual answer is mostly
    names, numbers and units, which carry more ("Paris" 17.8 bits, "Satya Nadella" 73), and a
    short spec has no prose to spare for them. A spec whose text questions allow 14 words or
    more has: the ``research-findings`` subscription (60 text words) is charged no allowance.
    """
    words = sum(q.max_words for q in questions if q.expected_format in TEXT_FORMATS)
    if words == 0:
        return 0.0
    return float(BITS_PER_WORD * max(0, min(ALLOWANCE_WORDS, ALLOWANCE_UNTIL - words)))


def facts_bits(max_words: int) -> float:
    """Return what a sealed value tells its controller: its word count, one of 0..max_words.

    The format is the spec's own and the handle is random; the text stays with the gateway
    (:mod:`peers.gateway.core.sealed`), so this is all a sealed field is charged.
    """
    return math.log2(max_words + 1)


def delivered_spec_bits(spec: QuerySpec) -> float:
    """Return :func:`spec_bits` with each sealed field's text charge replaced by its facts':
    what a delivery of the spec can tell the controller at most, as the risk report counts."""
    bits = spec_bits(spec)
    sealed = spec.sealed_keys()
    if spec.category == 3 and sealed:
        return facts_bits(spec.max_words or 0)
    for question in spec.questions or ():
        if question.id in sealed:
            bits += facts_bits(question.max_words) - question_bits(question)
    return max(0.0, bits)


def spec_bits(spec: QuerySpec) -> float:
    """Return the bits a whole spec costs: what the gateway charges against ``budget_bits``.

    Args:
        spec: a validated spec, or any model inheriting from :class:`~schemas.bcp.QuerySpec`
            (a query request, a subscription).

    Returns:
        The sum over fields or questions, with a Cat-2 spec's short-answer allowance
        (:func:`short_answer_allowance`); ``max_words`` x 11 for Cat-3. Exact for text (an
        integer as a float) and within float rounding for log2 terms.
    """
    if spec.category == 1:
        return math.fsum(field_bits(f) for f in spec.fields or ())
    if spec.category == 2:
        questions = spec.questions or ()
        return math.fsum(question_bits(q) for q in questions) + short_answer_allowance(questions)
    return text_bits(spec.max_words or 0)


CEILING_BITS_PER_WORD: Final = 48
"""The most a word of a text answer may carry on average: the per-question ceiling's rate.

English prose measures 9 to 14 bits a word under this code, short factual answers (names,
figures) 15 to 37, prose in other Latin-script languages 25 to 47, since the vocabulary is
English and their words are spelled out letter by letter; docs/bcp.md has the figures.
"""

CEILING_BITS_PER_QUESTION: Final = 64
"""What a question may carry beyond :data:`CEILING_BITS_PER_WORD` a word: room for a long
name or a figure with its unit in a short field."""


def question_ceiling(question: Question) -> float:
    """Return the most an answer to ``question`` may carry: 48 a word plus 64, or exact.

    Formats with an exact code are bounded by what their longest answer measures: ``yes_no``
    1 bit, ``date`` :data:`DATE_BITS`. Every other answer is measured (:func:`value_bits`) and
    refused when it measures more than this.
    """
    if question.expected_format == "yes_no":
        return 1.0
    if question.expected_format == "date":
        return DATE_BITS
    return _text_ceiling(question.max_words)


def _text_ceiling(max_words: int) -> float:
    return float(CEILING_BITS_PER_WORD * max_words + CEILING_BITS_PER_QUESTION)


def spec_ceiling(spec: QuerySpec, *, flag: bool = False) -> float:
    """Return the most an answer to ``spec`` may carry: the worst case the gateway reserves.

    Args:
        spec: the query's or subscription's spec.
        flag: the channel's ``anomaly_action`` is ``flag``: its findings reach the controller
            too, and :func:`findings_bits` of the most findings is added.

    Returns:
        Cat-1: :func:`spec_bits` (exact). Cat-2: the sum of :func:`question_ceiling`; Cat-3:
        48 a word of ``max_words`` plus 64. :func:`spec_bits` stays the estimate a spec shows.
    """
    if spec.category == 1:
        return spec_bits(spec)
    if spec.category == 2:
        bits = math.fsum(question_ceiling(q) for q in spec.questions or ())
    else:
        bits = _text_ceiling(spec.max_words or 0)
    return bits + (_findings_ceiling(spec) if flag else 0.0)


def _findings_slots(spec: QuerySpec) -> int:
    # One slot per answer key, and one for findings about the whole answer (a screener's).
    return len(spec.response_keys()) + 1


def _findings_ceiling(spec: QuerySpec) -> float:
    return float(_findings_slots(spec) * (1 + len(AnomalyCode)))


def findings_bits(spec: QuerySpec, codes: Sequence[tuple[str | None, str]]) -> float:
    """Return what the findings delivered on a ``flag`` channel carry: codes only.

    Each answer key, and the whole answer, has one slot: 1 bit says whether it has findings,
    then one bit per :class:`~schemas.bcp.AnomalyCode` says which (a prefix code: 1/2 +
    2^10 x 2^-11 = 1). Where in the text and which characters are never delivered.

    Args:
        spec: the spec answered (Cat-2 or Cat-3).
        codes: ``(field, code)`` pairs delivered; ``field`` None for the whole answer.
    """
    if spec.category == 1:
        return 0.0
    flagged = len({field for field, _code in codes})
    return float(_findings_slots(spec) + flagged * len(AnomalyCode))


def alphabet_of(expected_format: ExpectedFormat | None) -> Alphabet:
    """Return the alphabet of a question's format, or of a Cat-3 summary for ``None``."""
    return NAMES if expected_format == "person_name" else ENGLISH


def foreign_char(text: str, alphabet: Alphabet) -> str | None:
    """Return the first character of ``text`` that ``alphabet`` does not allow, or ``None``.

    Spaces are allowed: normalized text has single spaces between words.
    """
    if text.isascii():
        return None
    return next((c for c in text if c != " " and not alphabet.allows(c)), None)


def _digits_bits(digits: str) -> float:
    return _gamma(len(digits)) + len(digits) * math.log2(10)


def value_bits(text: str, max_words: int, expected_format: ExpectedFormat | None = None) -> float:
    """Return the most bits normalized ``text`` can carry as an answer of this format.

    Args:
        text: a delivered (normalized, canonical) answer that has its format.
        max_words: the question's or summary's word limit.
        expected_format: the question's format; ``None`` for a Cat-3 summary.

    Returns:
        The length of ``text`` in the module's prefix code; ``math.inf`` when a character is
        outside the field's alphabet.
    """
    if expected_format == "yes_no":
        return 1.0
    if expected_format == "date":
        return DATE_BITS
    if expected_format == "integer" and (match := _INTEGER.fullmatch(text)):
        return 1 + _digits_bits(match[1])
    if expected_format == "number" and (match := _NUMBER.fullmatch(text)):
        fraction = 1 + _digits_bits(match[2]) if match[2] else 1
        return 1 + _digits_bits(match[1]) + fraction
    alphabet = alphabet_of(expected_format)
    words = text.split()
    return math.log2(max_words) + math.fsum(word_bits(word, alphabet) for word in words)


def answer_bits(spec: QuerySpec, response: Mapping[str, NormalizedValue]) -> float:
    """Return the most bits a delivered answer to ``spec`` can carry: compare with the charge.

    Args:
        spec: the spec the answer was validated against.
        response: the normalized answer, every key of the spec present.

    Returns:
        Cat-1: :func:`spec_bits` (every field carries exactly its charge). Cat-2 and Cat-3: the
        sum of :func:`value_bits` over the answers. An answer is within its charge when this is
        at most ``spec_bits(spec)``.
    """
    if spec.category == 1:
        return spec_bits(spec)
    if spec.category == 3:
        return value_bits(str(response["summary"]), spec.max_words or 1)
    return math.fsum(
        value_bits(str(response[q.id]), q.max_words, q.expected_format)
        for q in spec.questions or ()
    )
