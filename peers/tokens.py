"""Where the ``bcpbus`` commands that connect to a bus find their token.

One order for every command (``bcpbus gateway``, ``bcpbus approve``): the ``--token`` flag, then
the ``--token-file`` file, then the environment variable ``BCPBUS_TOKEN``. The first one given
wins, so a flag overrides a token exported in the shell.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["TOKEN_ENV", "find_token"]

TOKEN_ENV = "BCPBUS_TOKEN"
"""The environment variable read when neither ``--token`` nor ``--token-file`` is given."""


def find_token(
    token: str | None, token_file: Path | None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The token from the flag, else the file (stripped), else ``$BCPBUS_TOKEN``; None if none.

    Raises:
        OSError: the file cannot be read (``bcpbus`` reports it with exit code 2).
    """
    if token:
        return token
    if token_file is not None:
        return token_file.read_text(encoding="utf-8").strip() or None
    return environ.get(TOKEN_ENV) or None
