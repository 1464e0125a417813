"""Untrusted text for a page: hidden characters become visible markers, markup stays text."""

from __future__ import annotations

from hypothesis import given, strategies as st

from peers.console.text import hidden, marker, reveal, segments


def test_bidi_invisible_and_control_characters_become_markers():
    """Overrides, isolates, zero-width characters, controls and odd spaces are shown as ⟨U+…⟩."""
    text = "a\u202eb\u2066c\u200bd\x1be\u00a0f\u2028g\ufeffh\U000e0041i\ufe0fj\tk"
    shown = "".join(piece for piece, _ in segments(text))
    assert shown == (
        "a⟨U+202E⟩b⟨U+2066⟩c⟨U+200B⟩d⟨U+001B⟩e⟨U+00A0⟩f⟨U+2028⟩g⟨U+FEFF⟩h⟨U+E0041⟩i⟨U+FE0F⟩j"
        "⟨U+0009⟩k"
    )


def test_plain_text_newlines_and_letters_of_any_script_stay():
    """Newlines, spaces and ordinary letters (Hebrew, CJK, emoji) are shown as they are."""
    text = "line one\nשלום 世界 🙂 café"
    assert list(segments(text)) == [(text, False)]


def test_markup_is_escaped_and_the_only_markup_is_the_markers():
    """<script>, attributes and quotes come out escaped; markers are the console's own spans."""
    out = str(reveal("<script>alert(\"x\")</script><img src=x onerror='y'>\u202e"))
    assert out == (
        "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=&#39;y&#39;&gt;"
        '<span class="cp">⟨U+202E⟩</span>'
    )


def test_long_text_is_cut_saying_how_much_was_left_out():
    """Past the limit the rest is counted, not shown."""
    assert list(segments("abcdef", limit=4)) == [
        ("abcd", False),
        ("⟨… 2 more characters not shown⟩", True),
    ]


@given(st.text())
def test_no_hidden_character_survives_and_the_visible_ones_keep_their_order(text):
    """Whatever the text, no hidden character reaches the page, and the rest is unchanged."""
    parts = list(segments(text))
    plain = "".join(piece for piece, is_marker in parts if not is_marker)
    assert not any(hidden(ch) for ch in plain)
    assert plain == "".join(ch for ch in text if not hidden(ch))
    assert sum(is_marker for _, is_marker in parts) == sum(hidden(ch) for ch in text)


@given(st.text())
def test_reveal_never_lets_a_tag_through(text):
    """The only '<' in reveal's output opens a marker span."""
    out = str(reveal(text))
    assert out.count("<") == 2 * out.count('<span class="cp">')


def test_marker_names_the_code_point():
    """A marker is the code point in U+ form, at least four digits."""
    assert marker("\u202e") == "⟨U+202E⟩" and marker("\x00") == "⟨U+0000⟩"
