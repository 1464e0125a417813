from typing import Any

import pytest
from hypothesis import given, strategies as st

from peers.gateway.normalize import (
    BIDI_CONTROLS,
    canonicalize,
    count_words,
    is_invisible,
    normalize_answer,
    normalize_summary,
    normalize_text,
)
from schemas.bcp import Question

FORMATS = [
    "short_text",
    "person_name",
    "date",
    "email",
    "integer",
    "number",
    "short_list",
    "yes_no",
]

# Every code point, surrogates included: JSON can carry lone surrogates ("\ud800").
any_text = st.text(st.characters(exclude_categories=()), max_size=60)


def question(expected_format: Any = "short_text", lowercase: bool | None = None) -> Question:
    return Question(
        id="q", question="?", max_words=10, expected_format=expected_format, lowercase=lowercase
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("ｉｇｎｏｒｅ", "ignore"),  # fullwidth
        ("ﬁnding", "finding"),  # ligature
        ("𝐛𝐨𝐥𝐝", "bold"),  # mathematical bold
        ("①", "1"),
        ("e\u0301", "é"),  # composed
    ],
)
def test_nfkc_folds_compatibility_forms(raw, expected):
    """NFKC turns fullwidth, ligature, styled and decomposed forms into plain text."""
    assert normalize_text(raw) == expected


@pytest.mark.parametrize(
    "invisible",
    [
        "\u200b",  # zero width space
        "\u200c",  # zero width non-joiner
        "\u200d",  # zero width joiner
        "\u2060",  # word joiner
        "\ufeff",  # byte order mark
        "\u00ad",  # soft hyphen
        "\u202e",  # right-to-left override
        "\u2066",  # left-to-right isolate
        "\u200f",  # right-to-left mark
        "\U000e0041",  # tag latin capital letter a
        "\U000e007f",  # cancel tag
        "\ufe0f",  # variation selector-16
        "\U000e0100",  # variation selector-17
        "\u3164",  # hangul filler
        "\u0007",  # bell
        "\ue000",  # private use
        "\ud800",  # lone surrogate
    ],
)
def test_invisible_characters_are_removed(invisible):
    """Zero-width, bidi, tag, variation, filler, control, private-use and surrogate go."""
    assert is_invisible(invisible)
    assert normalize_text(f"ab{invisible}cd") == "abcd"


def test_bidi_controls_are_invisible():
    """Every bidi control is also removed by normalization."""
    assert all(is_invisible(c) for c in BIDI_CONTROLS)


@pytest.mark.parametrize("char", ["a", " ", "\n", "\t", "é", "字", "-", "0"])
def test_visible_characters_and_whitespace_are_not_invisible(char):
    """Letters, digits, punctuation and whitespace are not removed as invisible."""
    assert not is_invisible(char)


def test_whitespace_collapses_and_trims():
    """Runs of any whitespace become one space; the ends are trimmed."""
    assert normalize_text("  a\t\tb\n\nc\u00a0d\u3000e\u2028f  ") == "a b c d e f"


def test_case_is_kept_unless_asked():
    """Case survives normalization unless lowercase is asked for."""
    assert normalize_text("Jane Smith") == "Jane Smith"
    assert normalize_text("Jane Smith", lowercase=True) == "jane smith"


def test_question_lowercase_applies():
    """A question with lowercase: true delivers lowercase text."""
    assert normalize_answer("Quantum BREAKTHROUGH", question(lowercase=True)) == (
        "quantum breakthrough"
    )
    assert normalize_answer("Quantum BREAKTHROUGH", question()) == "Quantum BREAKTHROUGH"


def test_summary_is_normalized_text():
    """A Cat-3 summary gets the text pipeline and keeps its case."""
    assert normalize_summary(" A  summary.\u200b ") == "A summary."


@pytest.mark.parametrize(
    ("text", "words"),
    [("", 0), ("one", 1), ("two words", 2), ("a - b", 3), ("量子计算", 1), ("a, b, c", 3)],
)
def test_words_are_whitespace_separated_tokens(text, words):
    """A word is a whitespace-separated token of the normalized text."""
    assert count_words(text) == words


@pytest.mark.parametrize(
    ("expected_format", "text", "canonical"),
    [
        ("yes_no", "Yes", "yes"),
        ("yes_no", "NO.", "no"),
        ("yes_no", "maybe", "maybe"),
        ("email", "Jane.Smith@Example.ORG", "jane.smith@example.org"),
        ("integer", "+007", "7"),
        ("integer", "-0", "0"),
        ("integer", "-012", "-12"),
        ("integer", "4.0", "4.0"),
        ("integer", "1,000", "1,000"),
        ("number", "00.500", "0.5"),
        ("number", ".5", "0.5"),
        ("number", "5.", "5"),
        ("number", "-0.0", "0"),
        ("number", "+12.25", "12.25"),
        ("number", "1e5", "1e5"),
        ("number", ".", "."),
        ("short_list", "a ,b,, c,", "a, b, c"),
        ("short_list", "single item", "single item"),
        ("date", "2024-03-15", "2024-03-15"),
        ("short_text", "Kept As Is.", "Kept As Is."),
        ("person_name", "Jane Smith", "Jane Smith"),
    ],
)
def test_canonical_forms(expected_format, text, canonical):
    """Each format has one canonical form; text not in the format is left for validation."""
    assert canonicalize(text, expected_format) == canonical


@given(any_text, st.booleans())
def test_normalize_text_is_idempotent(raw, lowercase):
    """Normalizing normalized text changes nothing."""
    once = normalize_text(raw, lowercase=lowercase)
    assert normalize_text(once, lowercase=lowercase) == once


@given(any_text, st.sampled_from(FORMATS), st.sampled_from([None, True]))
def test_normalize_answer_is_idempotent(raw, expected_format, lowercase):
    """normalize_answer(normalize_answer(x)) == normalize_answer(x) for every format."""
    q = question(expected_format, lowercase)
    once = normalize_answer(raw, q)
    assert normalize_answer(once, q) == once


@given(any_text)
def test_normalized_text_is_clean(raw):
    """Normalized text has no invisible characters, no double spaces and no outer spaces."""
    text = normalize_text(raw)
    assert not any(is_invisible(c) for c in text)
    assert "  " not in text
    assert text == text.strip()
    assert all(c == " " or not c.isspace() for c in text)


def test_fast_path_knows_every_extra_invisible_character():
    """The quick search for invisible non-format characters matches exactly the full set."""
    from peers.gateway.normalize import _EXTRA_SEARCH, _INVISIBLE_EXTRA

    matched = {chr(c) for c in range(0x110000) if _EXTRA_SEARCH(chr(c))}
    assert matched == _INVISIBLE_EXTRA


@pytest.mark.parametrize("extra", ["\u034f", "\u180e", "\u2800", "\ufe0f", "\U000e01ef"])
def test_invisible_characters_in_printable_text_are_removed(extra):
    """Invisible characters that str.isprintable() accepts are still removed."""
    assert normalize_text(f"plain{extra} text") == "plain text"
