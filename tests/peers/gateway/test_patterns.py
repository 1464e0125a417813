import re
import time

import pytest

from peers.gateway import cues, folding, patterns, screening
from peers.gateway.patterns import _factor, _split_top

# Every regular expression that screening runs on a reader's text.
ALL_PATTERNS = [
    *(
        pattern
        for table in (patterns.INSTRUCTION, patterns.URL, patterns.CODE, patterns.MARKUP)
        for pattern, _ in table
    ),
    screening._EMAIL,
    screening._B64_RUN,
    screening._HEX_RUN,
    screening._MORSE,
    folding._SPACED,
    folding._SPLIT,
    folding._TOKEN,
    cues._STRONG,
    cues._WEAK,
    cues._YOU,
    cues._IMPERATIVE,
]

# Repeated, each of these is hostile to some kind of pattern: long words, long runs of one
# punctuation mark, endless openings of a tag, a link, a group, a quote or a phrase.
HOSTILE_UNITS = [
    "a",
    " ",
    "a ",
    "ab ",
    ". ",
    ".",
    "-",
    ".- ",
    "a-",
    "a_",
    "a.",
    "a.b/",
    "<",
    "<a ",
    "<a/",
    "[",
    "[a",
    "](",
    "![",
    "`",
    "{",
    '{"',
    '"',
    "'",
    "' or ",
    "(",
    "a(",
    "a(b=",
    "=",
    ";",
    "; ",
    "#",
    "## ",
    "/",
    "/tmp",
    "www.",
    "a://",
    "@",
    "a@",
    "$",
    "${",
    "{{",
    "&",
    "&a",
    "\n",
    "\na",
    "you ",
    "your ",
    "ignore ",
    "ignore the ",
    "you must ",
    "from ",
    "as ",
    "i ",
    "1",
    "0x",
    "f",
    "==",
    "|",
    ":",
    "* ",
    "a*",
    "ignore all all ",
    "\\",
    "<!--",
    "-- ",
    "x",
    "aA1",
    "i g n o r e ",
    "in-",
    "gpt",
    "act as ",
    "you are ",
    "the the ",
    "system ",
]

SIZE = 1_000
"""Half the longest text a 50-word answer may have (raw_length_limit(50) is 1,856)."""
GROWTH = 8
QUICK = 0.005
"""A search on the long input faster than this is linear enough whatever its ratio."""
HOPELESS = 0.5
"""A search on the long input slower than this is not linear, whatever the short one took."""


def _seconds(pattern: re.Pattern[str], text: str, tries: int = 3) -> float:
    # The thread's CPU time, not the wall clock: on a loaded machine the wall clock also counts
    # the time other processes had the core, which is what made these ratios flaky.
    best = float("inf")
    for _ in range(tries):
        start = time.thread_time()
        for _ in pattern.finditer(text):
            pass
        best = min(best, time.thread_time() - start)
    return best


def _hostile(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


@pytest.mark.parametrize("pattern", ALL_PATTERNS, ids=lambda p: p.pattern[:40])
def test_every_pattern_takes_linear_time_on_hostile_input(pattern):
    """Eight times the input costs each pattern at most about eight times the time, never 64."""
    for unit in HOSTILE_UNITS:
        long = _seconds(pattern, _hostile(unit, SIZE * GROWTH), tries=1)
        if long < QUICK:
            continue
        assert long < HOPELESS, (unit, long)
        long = _seconds(pattern, _hostile(unit, SIZE * GROWTH), tries=5)
        short = _seconds(pattern, _hostile(unit, SIZE), tries=5)
        # Linear growth is a ratio of 8, quadratic 64: the slack between absorbs the noise
        # of a loaded machine.
        assert long / max(short, 1e-6) < GROWTH * 4, (unit, short, long)


@pytest.mark.parametrize("unit", ["a ", "ignore ", "you must ", "<a ", "[a", '{"', "- "])
def test_screen_takes_linear_time_on_hostile_input(unit):
    """The whole screen, normalization and folding included, grows linearly with its input."""

    def cost(size: int) -> float:
        text = _hostile(unit, size)
        best = float("inf")
        for _ in range(3):
            start = time.thread_time()  # CPU time: see _seconds
            screening.screen(text)
            best = min(best, time.thread_time() - start)
        return best

    short, long = cost(SIZE), cost(SIZE * GROWTH)
    assert long < QUICK * 5 or long / short < GROWTH * 4, (short, long)


def test_split_top_ignores_bars_inside_groups_classes_and_escapes():
    """Only the top-level alternation splits a pattern."""
    assert _split_top(r"a|(b|c)|[|]|\||d") == ["a", "(b|c)", "[|]", r"\|", "d"]
    assert _split_top(r"[]|]x|y") == ["[]|]x", "y"]


def test_factor_shares_one_word_boundary_and_keeps_the_matches():
    """``\\bA|\\bB|C`` becomes ``\\b(?:A|B)|C`` and matches exactly what it did."""
    pattern = r"\bfoo\b|\bbar baz|qux"
    factored = _factor(pattern)
    assert factored == r"\b(?:foo\b|bar baz)|qux"
    for text in ("foo", "afoo", "bar baz", "xbar baz", "qux", "aqux", "none"):
        assert bool(re.search(pattern, text)) == bool(re.search(factored, text))
    assert _factor(r"\bonly|other") == r"\bonly|other"
