"""Where the system peer gets agents' tokens: a folder the operator filled, or the bus's memory."""

from __future__ import annotations

import pytest

from bus.ops.credentials import Credentials
from peers.system.tokens import DirectoryTokens, EphemeralTokens, NoToken


def test_a_token_file_readable_by_its_owner_only_is_used(tmp_path):
    """DIR/<name>.token, chmod 600, gives agent:<name>'s token, whitespace stripped."""
    path = tmp_path / "echo.token"
    path.write_text("bcpbus_secret\n")
    path.chmod(0o600)
    assert DirectoryTokens(tmp_path).token_for("agent:echo") == "bcpbus_secret"


@pytest.mark.parametrize(
    ("content", "mode", "words"),
    [
        (None, None, "no token file"),
        ("bcpbus_secret\n", 0o644, "is readable by other users; run: chmod 600"),
        ("bcpbus_secret\n", 0o640, "is readable by other users"),
        ("\n", 0o600, "does not hold one token"),
        ("x" * 600, 0o600, "does not hold one token"),
    ],
)
def test_no_usable_token_is_refused_with_what_to_do(tmp_path, content, mode, words):
    """Missing, shared, empty or oversized: NoToken, saying how to make a good one."""
    path = tmp_path / "echo.token"
    if content is not None:
        path.write_text(content)
        path.chmod(mode)
    with pytest.raises(NoToken, match=words) as info:
        DirectoryTokens(tmp_path).token_for("agent:echo")
    assert str(path) in str(info.value)


def test_a_directory_in_place_of_the_file_is_refused(tmp_path):
    """A path that is not a regular file gives no token."""
    (tmp_path / "echo.token").mkdir()
    with pytest.raises(NoToken):
        DirectoryTokens(tmp_path).token_for("agent:echo")


def test_minted_tokens_are_accepted_by_the_bus_and_replace_the_previous_one():
    """EphemeralTokens adds a credential the bus verifies; minting again revokes the old token."""
    credentials = Credentials.empty()
    tokens = EphemeralTokens(credentials)
    first = tokens.token_for("agent:echo")
    assert credentials.verify("agent:echo", first) is not None
    second = tokens.token_for("agent:echo")
    assert credentials.verify("agent:echo", second) is not None
    assert credentials.verify("agent:echo", first) is None
