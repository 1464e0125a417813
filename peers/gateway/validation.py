"""Deterministic validation of BCP answers against their spec: the gateway's security core.

:func:`validate_response` takes a spec and whatever the reader sent (any JSON value: the reader
must be assumed hostile) and returns a :class:`ValidationResult`; it never raises, and its work is
bounded by the spec, not by the answer. The rules, by category (BCP §"Validation Strategies"):

- every category: the answer is a JSON object whose keys are exactly the spec's (field names,
  question ids, or ``summary``); a missing or an extra key fails the whole answer, because the
  presence of a key is itself a hidden channel.
- Cat-1: a boolean is a JSON boolean (not ``0``/``1``, not ``"true"``); an integer is a JSON
  integer (not a boolean, not ``1.0``, not ``"1"``) within ``[min, max]``; an enum value is exactly
  one of ``values`` (no case folding).
- Cat-2: each answer is a string; after normalization it is non-empty, has at most ``max_words``
  words of at most :data:`MAX_WORD_CHARS` characters each, has its ``expected_format`` and only
  characters of its format's alphabet (:func:`~peers.gateway.bits.alphabet_of`: other scripts are
  ``bad_format``), agrees with its ``same_as`` question, and passes screening.
- Cat-3: ``{"summary": text}`` under the same text rules without a format; always needs a human's
  approval (:attr:`ValidationResult.approval_required`).
- Cat-2 and Cat-3, once every part is valid: the whole answer can carry no more bits than its
  spec's ceiling (:func:`~peers.gateway.bits.spec_ceiling`, 48 a word plus 64 a question), nor
  than the gateway reserved for it when the budget left was smaller (``max_bits``), or it is
  ``too_long``. Within that, what it carries (:func:`~peers.gateway.bits.answer_bits`,
  :attr:`ValidationResult.value_bits`) is what the channel is charged.

Which form each check reads: the JSON type and the length bound read the raw answer; screening
reads the raw answer too (invisible and bidi characters are findings although normalization drops
them); words and formats read the normalized, canonical form the controller will receive
(:mod:`peers.gateway.normalize`), so ``"+007"`` is the integer ``"7"`` and ``"Yes."`` is ``"yes"``.

The formats of ``expected_format``:

- ``short_text``: any text.
- ``person_name``: letters of any script, combining marks, spaces, ``-``, ``'``, ``’`` and ``.``.
- ``date``: an ISO 8601 calendar date, ``YYYY-MM-DD``, that exists.
- ``email``: an ASCII address, ``local@domain.tld``, at most 254 characters; lowercased.
- ``integer``: an optional ``-`` and ASCII digits; delivered without ``+`` or zero padding.
- ``number``: an integer or a decimal fraction (``-12.5``, ``.5``); no exponent, no thousands
  separators; delivered in its shortest form.
- ``short_list``: comma-separated items, delivered joined with ``", "`` (each item's words count).
- ``yes_no``: ``yes`` or ``no`` in any case, optionally with a final period; delivered lowercase.
"""

from __future__ import annotations

import datetime
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import Any, Final

from peers.gateway.bits import alphabet_of, answer_bits, foreign_char, spec_ceiling
from peers.gateway.normalize import count_words, normalize_answer, normalize_summary
from peers.gateway.screening import screen
from schemas.bcp import (
    Anomaly,
    AnomalyAction,
    Category,
    ExpectedFormat,
    NormalizedResponse,
    NormalizedValue,
    QuerySpec,
    SpecField,
    ValidationCode,
    ValidationReason,
)

__all__ = [
    "MAX_WORD_CHARS",
    "ValidationResult",
    "check_format",
    "format_hint",
    "raw_length_limit",
    "validate_response",
]

MAX_WORD_CHARS: Final = 64
"""Longest word accepted, whatever it measures: it bounds the work of measuring a word."""

_RAW_CHARS_PER_WORD: Final = 32
_RAW_SLACK: Final = 256
_MAX_EXTRA_REPORTED: Final = 5
_PREVIEW: Final = 40
_DETAIL_CHARS: Final = 1000


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """The verdict on one answer.

    Deliver ``response`` when ``accepted``, after a human's approval if
    :attr:`approval_required`; otherwise send the reader ``reasons`` (:meth:`detail` is the
    same as text). ``anomalies`` lists what screening found either way: log them, and on a
    ``flag`` channel deliver them with the response.
    """

    category: Category
    accepted: bool
    response: NormalizedResponse | None
    """The normalized answer in the spec's order; ``None`` unless accepted."""
    reasons: tuple[ValidationReason, ...] = ()
    anomalies: tuple[Anomaly, ...] = ()
    needs_review: bool = False
    """Accepted on a ``review`` channel with anomalies: a human must approve it."""
    value_bits: float = 0.0
    """What the accepted answer carries (:func:`~peers.gateway.bits.answer_bits`): its charge."""

    @property
    def approval_required(self) -> bool:
        """Whether a human must approve before delivery: every Cat-3 answer, and reviews."""
        return self.accepted and (self.category == 3 or self.needs_review)

    def detail(self) -> str:
        """Return the reasons as one line of at most about 1,000 characters.

        Fit for ``bcp_validation_result.detail``; ``reasons`` has them all.
        """
        if self.accepted:
            return "accepted"
        parts: list[str] = []
        size = 0
        for index, r in enumerate(self.reasons):
            part = f"{r.field}: {r.message}" if r.field is not None else r.message
            if parts and size + len(part) > _DETAIL_CHARS:
                parts.append(f"and {len(self.reasons) - index} more")
                break
            parts.append(part)
            size += len(part) + 2
        return "; ".join(parts)


def raw_length_limit(max_words: int) -> int:
    """Return the most characters a text answer of ``max_words`` words may have, raw or NFKC.

    Checked before screening and normalization, so that hostile text cannot make them do
    unbounded work.
    """
    return max_words * _RAW_CHARS_PER_WORD + _RAW_SLACK


def validate_response(
    spec: QuerySpec,
    response: object,
    *,
    anomaly_action: AnomalyAction = "reject",
    max_bits: float | None = None,
) -> ValidationResult:
    """Validate and normalize a reader's answer to ``spec``.

    Args:
        spec: the query's or subscription's spec (any :class:`~schemas.bcp.QuerySpec`).
        response: the ``response`` member of the ``bcp_response`` exactly as received: any
            JSON value.
        anomaly_action: the channel's: ``reject`` fails an answer that screening flags,
            ``review`` accepts it with ``needs_review``, ``flag`` accepts it.
        max_bits: the most the answer may carry when that is less than the spec's ceiling:
            what the gateway could reserve of the budget left. ``None``: the ceiling.

    Returns:
        The verdict; never raises on any ``response``.
    """
    if not isinstance(response, dict):
        message = f"the answer must be a JSON object, not {_describe(response)}"
        reason = _reason(None, ValidationCode.NOT_AN_OBJECT, message)
        return ValidationResult(spec.category, False, None, (reason,))
    reasons = _check_keys(spec.response_keys(), response)
    anomalies: list[Anomaly] = []
    values: dict[str, NormalizedValue] = {}
    if spec.category == 1:
        for field in spec.fields or ():
            if field.name in response:
                _check_field(field, response[field.name], values, reasons)
    elif spec.category == 2:
        _check_answers(spec, response, values, anomalies, reasons)
    elif "summary" in response:
        _check_summary(spec, response["summary"], values, anomalies, reasons)
    carried = 0.0
    if not reasons:
        carried = answer_bits(spec, values)
        if spec.category != 1:
            _check_capacity(spec, carried, max_bits, reasons)
    if anomalies and anomaly_action == "reject":
        reasons.extend(_anomaly_reasons(anomalies))
    if reasons:
        return ValidationResult(spec.category, False, None, tuple(reasons), tuple(anomalies))
    # Canonical field order (BCP hidden channels: ordering carries log2(N!) bits).
    ordered = {key: values[key] for key in spec.response_keys()}
    review = anomaly_action == "review" and bool(anomalies)
    return ValidationResult(spec.category, True, ordered, (), tuple(anomalies), review, carried)


def _check_answers(
    spec: QuerySpec,
    response: dict[str, Any],
    values: dict[str, NormalizedValue],
    anomalies: list[Anomaly],
    reasons: list[ValidationReason],
) -> None:
    """Cat-2: check, screen and normalize each question's answer into ``values``."""
    for question in spec.questions or ():
        if question.id in response:
            text = _check_text(
                question.id,
                response[question.id],
                question.max_words,
                partial(normalize_answer, question=question),
                anomalies,
                reasons,
                allow_email=question.expected_format == "email",
            )
            if text is not None:
                _store_formatted(question.id, text, question.expected_format, values, reasons)
    _check_same_as(spec, values, reasons)


def _check_summary(
    spec: QuerySpec,
    summary: object,
    values: dict[str, NormalizedValue],
    anomalies: list[Anomaly],
    reasons: list[ValidationReason],
) -> None:
    """Cat-3: check, screen and normalize the summary into ``values``."""
    text = _check_text(
        "summary", summary, spec.max_words or 0, normalize_summary, anomalies, reasons
    )
    if text is not None and _check_alphabet("summary", text, None, reasons):
        values["summary"] = text


def _reason(field: str | None, code: ValidationCode, message: str) -> ValidationReason:
    return ValidationReason(field=field, code=code, message=message)


def _check_keys(keys: tuple[str, ...], response: dict[object, object]) -> list[ValidationReason]:
    reasons = [
        _reason(key, ValidationCode.MISSING, "no answer for this key")
        for key in keys
        if key not in response
    ]
    present = len(keys) - len(reasons)
    if len(response) > present:
        # Only the first keys are looked at: the spec's keys plus a few extras, never all of a
        # hostile object's keys.
        expected = set(keys)
        scanned = islice(response, len(keys) + _MAX_EXTRA_REPORTED)
        extras = [key for key in scanned if key not in expected][:_MAX_EXTRA_REPORTED]
        for key in extras:
            message = f"unexpected key {_describe(key)}: not in the spec"
            reasons.append(_reason(None, ValidationCode.UNEXPECTED, message))
        if (more := len(response) - present - len(extras)) > 0:
            message = f"{more} more keys that are not in the spec"
            reasons.append(_reason(None, ValidationCode.UNEXPECTED, message))
    return reasons


def _check_field(
    field: SpecField,
    value: object,
    values: dict[str, NormalizedValue],
    reasons: list[ValidationReason],
) -> None:
    name = field.name
    if field.type == "boolean":
        # JSON booleans only: bool is a subclass of int, and 0/1 or "true" are not answers.
        if type(value) is bool:
            values[name] = value
        else:
            message = f"expected a JSON boolean, got {_describe(value)}"
            reasons.append(_reason(name, ValidationCode.WRONG_TYPE, message))
    elif field.type == "integer":
        low, high = field.bounds()
        if type(value) is not int:
            message = f"expected a JSON integer, got {_describe(value)}"
            reasons.append(_reason(name, ValidationCode.WRONG_TYPE, message))
        elif not low <= value <= high:
            message = f"{_describe(value)} is outside [{low}, {high}]"
            reasons.append(_reason(name, ValidationCode.OUT_OF_RANGE, message))
        else:
            values[name] = value
    elif type(value) is not str:
        message = f"expected one of the enum's strings, got {_describe(value)}"
        reasons.append(_reason(name, ValidationCode.WRONG_TYPE, message))
    elif value not in (field.values or ()):
        message = f"{_describe(value)} is not one of the enum's values"
        reasons.append(_reason(name, ValidationCode.NOT_A_MEMBER, message))
    else:
        values[name] = value


def _check_text(
    key: str,
    raw: object,
    max_words: int,
    normalize: Callable[[str], str],
    anomalies: list[Anomaly],
    reasons: list[ValidationReason],
    *,
    allow_email: bool = False,
) -> str | None:
    """Check one text answer; return its normalized form, or ``None`` after adding a reason."""
    if type(raw) is not str:
        message = f"expected a JSON string, got {_describe(raw)}"
        reasons.append(_reason(key, ValidationCode.WRONG_TYPE, message))
        return None
    limit = raw_length_limit(max_words)
    # Length first, then NFKC's expansion (U+FDFA alone is 18 characters): both bound the
    # work that screening and normalization do on hostile text.
    if (size := len(raw)) > limit or (size := len(unicodedata.normalize("NFKC", raw))) > limit:
        message = f"{size} characters, more than {limit} for {max_words} words"
        reasons.append(_reason(key, ValidationCode.TOO_LONG, message))
        return None
    anomalies.extend(screen(raw, field=key, allow_email=allow_email))
    text = normalize(raw)
    if not text:
        reasons.append(_reason(key, ValidationCode.EMPTY, "nothing left after normalization"))
        return None
    if (words := count_words(text)) > max_words:
        message = f"{words} words, the limit is {max_words}"
        reasons.append(_reason(key, ValidationCode.TOO_MANY_WORDS, message))
        return None
    if (longest := max(len(word) for word in text.split())) > MAX_WORD_CHARS:
        message = f"a word of {longest} characters, the limit is {MAX_WORD_CHARS}"
        reasons.append(_reason(key, ValidationCode.TOO_LONG, message))
        return None
    return text


def _store_formatted(
    key: str,
    text: str,
    expected_format: ExpectedFormat,
    values: dict[str, NormalizedValue],
    reasons: list[ValidationReason],
) -> None:
    if not check_format(text, expected_format):
        message = f"not a valid {expected_format}: {_FORMAT_HINTS[expected_format]}"
        reasons.append(_reason(key, ValidationCode.BAD_FORMAT, message))
    elif _check_alphabet(key, text, expected_format, reasons):
        values[key] = text


def _check_alphabet(
    key: str,
    text: str,
    expected_format: ExpectedFormat | None,
    reasons: list[ValidationReason],
) -> bool:
    """Refuse a script the field does not allow: its characters would carry more than charged."""
    alphabet = alphabet_of(expected_format)
    if (char := foreign_char(text, alphabet)) is None:
        return True
    name = unicodedata.name(char, "unnamed character")
    message = f"U+{ord(char):04X} {name} is not allowed here, only ASCII and {alphabet.name}"
    reasons.append(_reason(key, ValidationCode.BAD_FORMAT, message))
    return False


def _check_capacity(
    spec: QuerySpec, carried: float, max_bits: float | None, reasons: list[ValidationReason]
) -> None:
    """Refuse an answer that carries more than its ceiling or what was reserved for it."""
    ceiling = spec_ceiling(spec)
    if carried > ceiling:
        message = (
            f"the answer can carry {carried:.1f} bits, more than the {ceiling:.1f} this spec "
            "allows: use fewer or commoner words"
        )
        reasons.append(_reason(None, ValidationCode.TOO_LONG, message))
    elif max_bits is not None and carried > max_bits + 1e-9:
        message = (
            f"the answer can carry {carried:.1f} bits, more than the {max_bits:.1f} left of "
            "the channel's budget: use fewer or commoner words"
        )
        reasons.append(_reason(None, ValidationCode.TOO_LONG, message))


def _check_same_as(
    spec: QuerySpec, values: dict[str, NormalizedValue], reasons: list[ValidationReason]
) -> None:
    # Redundant extraction (BCP Cat-2): two phrasings of one question must agree. Case is
    # ignored: the answers may differ in their questions' ``lowercase`` only.
    for question in spec.questions or ():
        other = question.same_as
        if other is None or question.id not in values or other not in values:
            continue
        if str(values[question.id]).casefold() != str(values[other]).casefold():
            message = f"disagrees with the answer to {other!r}"
            reasons.append(_reason(question.id, ValidationCode.SAME_AS_MISMATCH, message))


def _anomaly_reasons(anomalies: list[Anomaly]) -> list[ValidationReason]:
    by_field: dict[str | None, list[str]] = {}
    for anomaly in anomalies:
        by_field.setdefault(anomaly.field, []).append(anomaly.detail)
    return [
        _reason(field, ValidationCode.ANOMALY, "screening: " + ", ".join(details))
        for field, details in by_field.items()
    ]


# Formats, checked on the canonical form (peers.gateway.normalize.canonicalize).

_NAME_PUNCTUATION: Final = frozenset(" -'’.")
_DATE: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_EMAIL: Final = re.compile(
    r"[a-z0-9_%+-]+(?:\.[a-z0-9_%+-]+)*@(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}"
)
_INTEGER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)")
_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]*[1-9])?")


def _is_person_name(text: str) -> bool:
    return any(c.isalpha() for c in text) and all(
        c.isalpha() or c in _NAME_PUNCTUATION or unicodedata.category(c).startswith("M")
        for c in text
    )


def _is_date(text: str) -> bool:
    if not _DATE.fullmatch(text):
        return False
    try:
        datetime.date.fromisoformat(text)
    except ValueError:  # 2024-02-30, or year 0000
        return False
    return True


_FORMAT_CHECKS: Final[dict[ExpectedFormat, Callable[[str], bool]]] = {
    "short_text": bool,
    "person_name": _is_person_name,
    "date": _is_date,
    "email": lambda text: len(text) <= 254 and bool(_EMAIL.fullmatch(text)),
    "integer": lambda text: bool(_INTEGER.fullmatch(text)),
    "number": lambda text: bool(_NUMBER.fullmatch(text)),
    "short_list": bool,
    "yes_no": lambda text: text in ("yes", "no"),
}

_FORMAT_HINTS: Final[dict[ExpectedFormat, str]] = {
    "short_text": "any text",
    "person_name": "letters, spaces, hyphens, apostrophes and periods only",
    "date": "an existing date written YYYY-MM-DD",
    "email": "an address like name@example.org",
    "integer": "digits with an optional minus sign",
    "number": "digits with an optional minus sign and decimal point, no exponent",
    "short_list": "comma-separated items",
    "yes_no": "yes or no",
}


def check_format(text: str, expected_format: ExpectedFormat) -> bool:
    """Return whether canonical ``text`` has ``expected_format`` (the module docstring lists them).

    Args:
        text: the output of :func:`~peers.gateway.normalize.normalize_answer`.
        expected_format: the question's format.
    """
    return _FORMAT_CHECKS[expected_format](text)


def format_hint(expected_format: ExpectedFormat) -> str:
    """Return what an answer of ``expected_format`` looks like, in a few words for a person."""
    return _FORMAT_HINTS[expected_format]


def _describe(value: object) -> str:
    """Name a hostile value without echoing much of it (it may be huge or full of controls)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        # str() of a huge int raises ValueError past 4300 digits: describe those by size.
        return f"integer {value}" if value.bit_length() <= 64 else "a very large integer"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {_preview(value)}"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _preview(text: str) -> str:
    # ascii() escapes invisible and bidi characters, so the preview is safe in logs.
    if len(text) > _PREVIEW:
        return ascii(text[:_PREVIEW])[:-1] + "...'"
    return ascii(text)
