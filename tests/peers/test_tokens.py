"""The one token lookup of the commands that connect: flag, then file, then environment."""

from __future__ import annotations

from pathlib import Path

from peers.tokens import TOKEN_ENV, find_token


def test_the_flag_wins_then_the_file_then_the_environment(tmp_path: Path) -> None:
    """--token beats --token-file, which beats $BCPBUS_TOKEN; nothing given is None."""
    file = tmp_path / "t.token"
    file.write_text("from-file\n")
    env = {TOKEN_ENV: "from-env"}
    assert find_token("from-flag", file, env) == "from-flag"
    assert find_token(None, file, env) == "from-file"
    assert find_token(None, None, env) == "from-env"
    assert find_token(None, None, {}) is None


def test_an_empty_file_or_variable_is_no_token(tmp_path: Path) -> None:
    """A file of blanks or an empty variable counts as not given."""
    file = tmp_path / "t.token"
    file.write_text("  \n")
    assert find_token(None, file, {TOKEN_ENV: "x"}) is None
    assert find_token("", None, {TOKEN_ENV: ""}) is None
