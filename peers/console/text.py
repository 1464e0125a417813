"""Untrusted text for a web page: every character that could hide or reorder text made visible.

A reader's answer is written by whoever wrote what the reader read. In a page it must stay
text: Jinja2 escapes ``<``, ``>``, ``&`` and quotes (autoescape), so markup never becomes markup.
Escaping does not stop what a browser does with characters that are not markup: a right-to-left
override (U+202E) reverses what follows it, zero-width characters hide words inside words, a
line separator breaks a line where none shows in the source. :func:`reveal` turns each such
character into a visible marker, ``⟨U+202E⟩``, as :func:`bus.log.audit.neutralize` turns them into
``\\u202e`` for a terminal, and :func:`segments` says which parts are markers so that a template
can style them apart from the text.

What counts (:func:`hidden`): every control character but the newline, format characters
(bidi embeddings, overrides and isolates, zero-width joiners and spaces, the BOM, tag
characters, the soft hyphen), line and paragraph separators, private-use, surrogate and
unassigned code points, variation selectors, and the spaces that are not U+0020 (no-break,
ideographic, em and the like), which look like a plain space and are not one. Tabs too: the
page lays text out by its own rules.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

from markupsafe import Markup, escape

__all__ = ["MAX_SHOWN", "hidden", "marker", "reveal", "segments"]

MAX_SHOWN = 20_000
"""Characters of one text a page shows at most; the rest is counted, not shown."""

_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
# Invisible letters and marks that the categories above miss: Hangul fillers, the Braille
# blank, variation selectors (they change how the character before them looks).
_INVISIBLE = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x180E})


def hidden(ch: str) -> bool:
    """Whether ``ch`` (one character) is shown as a marker rather than as itself."""
    if ch == "\n":
        return False
    if ch == " ":
        return False
    code = ord(ch)
    if code in _INVISIBLE or 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:
        return True
    return unicodedata.category(ch) in _HIDDEN_CATEGORIES


def marker(ch: str) -> str:
    """The visible stand-in of a hidden character: ``⟨U+202E⟩``."""
    return f"⟨U+{ord(ch):04X}⟩"


def segments(text: str, limit: int = MAX_SHOWN) -> Iterator[tuple[str, bool]]:
    """Split ``text`` into runs of plain text and markers: ``(text, is_marker)`` pairs.

    At most ``limit`` characters of ``text`` are shown; past them a last marker says how many
    were left out.
    """
    shown, rest = text[:limit], len(text) - limit
    run: list[str] = []
    for ch in shown:
        if not hidden(ch):
            run.append(ch)
            continue
        if run:
            yield "".join(run), False
            run = []
        yield marker(ch), True
    if run:
        yield "".join(run), False
    if rest > 0:
        yield f"⟨… {rest} more characters not shown⟩", True


def reveal(value: object, limit: int = MAX_SHOWN) -> Markup:
    """``value`` as text, HTML-escaped, each hidden character as a ``<span class="cp">`` marker.

    The only markup in the result is the markers' spans; everything from ``value`` is escaped.
    Use it as a Jinja2 filter: ``{{ text | reveal }}``.
    """
    text = value if isinstance(value, str) else str(value)
    parts = []
    for piece, is_marker in segments(text, limit):
        if is_marker:
            parts.append(Markup('<span class="cp">{}</span>').format(piece))
        else:
            parts.append(escape(piece))
    return Markup("").join(parts)
