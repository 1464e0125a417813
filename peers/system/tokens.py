"""Where the system peer gets the token of an agent it starts.

The bus keeps only the hashes of tokens, so whoever starts an agent must have been given its
token. Two sources, and no third: when neither has one, the agent is not started (fail closed).

- :class:`DirectoryTokens` (``bcpbus system --tokens-dir DIR``): the operator made each token
  with ``bcpbus peers add agent:<name>`` and wrote it to ``DIR/<name>.token``. A file readable
  by other users is refused, as ssh refuses such a key.
- :class:`EphemeralTokens`: a system peer that runs in the bus's own process mints the token in
  the bus's memory (never written to the peers file, gone when the bus stops), as ``bcpbus
  serve`` does for its gateway. A separate process cannot: a running bus does not read the
  peers file again, so a token written there would not be accepted.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Protocol

from bus.ops.credentials import Credentials

__all__ = ["DirectoryTokens", "EphemeralTokens", "NoToken", "TokenSource"]

_MAX_TOKEN = 512  # the longest token initialize accepts


class NoToken(Exception):
    """There is no usable token for the agent; the message says what the operator should do."""


class TokenSource(Protocol):
    """Gives the token an agent process authenticates with."""

    def token_for(self, client_id: str) -> str:
        """Return the token of ``client_id`` (``agent:<name>``).

        Raises:
            NoToken: there is none, or it may not be used.
        """
        ...


class DirectoryTokens:
    """Tokens in ``DIR/<name>.token``, one per agent, each readable by its owner only."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def token_for(self, client_id: str) -> str:
        """Read ``<name>.token`` for ``agent:<name>``, stripped of surrounding whitespace.

        Raises:
            NoToken: the file is missing, not a regular file, readable by group or others,
                empty, or longer than a token can be.
        """
        name = client_id.partition(":")[2]
        path = self.directory / f"{name}.token"
        make = f"(umask 077; bcpbus peers add {client_id} > {path})"
        try:
            with open(path, encoding="utf-8") as f:
                mode = os.fstat(f.fileno()).st_mode
                text = f.read(_MAX_TOKEN + 2)
        except FileNotFoundError:
            raise NoToken(f"no token file {path}; make one with: {make}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise NoToken(f"cannot read {path}: {exc}") from exc
        if not stat.S_ISREG(mode):
            raise NoToken(f"{path} is not a regular file")
        if os.name == "posix" and mode & 0o077:
            raise NoToken(f"{path} is readable by other users; run: chmod 600 {path}")
        token = text.strip()
        if not token or len(token) > _MAX_TOKEN:
            raise NoToken(f"{path} does not hold one token; make it with: {make}")
        return token


class EphemeralTokens:
    """Tokens minted in the bus's own credentials, for a system peer in the bus's process.

    Each call replaces the agent's previous token, so only the process started last can
    connect as that agent.
    """

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def token_for(self, client_id: str) -> str:
        """Mint a token for ``client_id`` that the bus accepts until it stops."""
        return self.credentials.add_ephemeral(client_id, [])
