"""What ``bcpbus`` checks before it opens anything, and how it says what went wrong.

Every check raises :class:`StartupError`, whose message is one line that names the option (or
file) and the value, and says what to do: ``bcpbus`` prints it after ``bcpbus: error:`` and
exits with 2, never with a traceback. The checks run before the activity log is opened or a
socket is bound, so a mistake costs nothing; :func:`explain_bind` and :func:`explain_db` turn
what still fails later (a port someone else took meanwhile, a disk that refuses the file) into
the same kind of line.
"""

from __future__ import annotations

import errno
import importlib
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from schemas.agents import AgentDefinition

__all__ = [
    "SQLITE_HEADER",
    "HTTP_EXTRA",
    "StartupError",
    "check_db",
    "check_http_extra",
    "check_port",
    "explain_bind",
    "explain_db",
    "summary",
]

SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""


class StartupError(ValueError):
    """A command cannot start; the message is one line that says what to change."""


def check_port(port: int, option: str = "--port") -> int:
    """Return ``port`` if a server can listen on it.

    Raises:
        StartupError: it is outside 0..65535.
    """
    if not 0 <= port <= 65535:
        raise StartupError(
            f"{option} {port}: a port is a number from 1 to 65535 (0 picks a free one)"
        )
    return port


def check_db(path: Path, option: str = "--db") -> Path:
    """Return ``path`` if an activity log can be opened or created there.

    Raises:
        StartupError: it is a directory, its directory is missing or not writable, or it is a
            file that is not an SQLite database.
    """
    if path.is_dir():
        raise StartupError(
            f"{option} {path} is a directory: give a file in it, e.g. {option} {path / 'bcpbus.db'}"
        )
    directory = path.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent  # the log creates the missing directories
    if not directory.is_dir():
        raise StartupError(
            f"{option} {path}: {directory} is a file, not a directory: give another path"
        )
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            raise StartupError(
                f"{option} {path} is not writable by this user: fix its permissions or give "
                "another file"
            )
        _check_header(path, option)
    elif not os.access(directory, os.W_OK | os.X_OK):
        raise StartupError(
            f"{option} {path}: the directory {directory} is not writable by this user: give a "
            "path in a directory you can write"
        )
    return path


def _check_header(path: Path, option: str) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StartupError(f"{option} {path}: cannot read it: {exc.strerror}") from exc
    if head and head != SQLITE_HEADER:
        raise StartupError(
            f"{option} {path} is not an SQLite database: give the activity log's file, or a new "
            "path for a new log"
        )


HTTP_EXTRA: Final = ("starlette", "uvicorn", "httpx", "prometheus_client")
"""The modules the HTTP binding imports: the ``http`` extra (pyproject.toml)."""


def check_http_extra(port: int, option: str = "--http-port") -> None:
    """Check that the HTTP binding can be served on ``port``: a port number, and the ``http``
    extra installed, so that neither fails after the bus has opened its log.

    Raises:
        StartupError: the port is out of range, or a module of the extra cannot be imported.
    """
    check_port(port, option)
    for name in HTTP_EXTRA:
        try:
            importlib.import_module(name)
        except ImportError:
            raise StartupError(
                f"{option} {port}: the HTTP binding needs the http extra ({name} is not "
                "installed): pip install 'bcpbus[http]', or leave out " + option
            ) from None


def explain_bind(exc: OSError, host: str, port: int, option: str = "--port") -> StartupError:
    """The one line for a listening socket that could not be opened on ``host:port``; ``option``
    is the one that gave the port (``--http-port`` for the HTTP binding's)."""
    if exc.errno == errno.EADDRINUSE:
        return StartupError(
            f"{option} {port}: something already listens on {host}:{port} (another bus?): stop "
            f"it, or give another port ({option} 0 picks a free one)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartupError(
            f"--host {host}: no interface of this machine has that address: give one it has, "
            "e.g. --host 127.0.0.1 or --host 0.0.0.0"
        )
    if exc.errno == errno.EACCES:
        return StartupError(
            f"{option} {port}: this user may not listen on it (ports below 1024 need privileges): "
            "give a port from 1024 up"
        )
    reason = exc.strerror or str(exc)
    return StartupError(f"--host {host} {option} {port}: cannot listen there: {reason}")


def explain_db(exc: sqlite3.Error, path: Path, option: str = "--db") -> StartupError:
    """The one line for an activity log SQLite refused to open at ``path``."""
    return StartupError(
        f"{option} {path}: SQLite cannot open it ({exc}): give a writable file path, or check "
        "the disk and the directory's permissions"
    )


def summary(
    *,
    policy: str,
    roles: int,
    peers_file: Path,
    peers: int,
    agents_dir: Path | None,
    agents: Mapping[str, AgentDefinition],
    gateway: bool,
    db: Path,
    log_level: str,
    checkpoints: str = "off",
) -> list[str]:
    """The lines ``bcpbus serve`` prints on stderr before it listens: what it runs with.

    Args:
        checkpoints: where the log's signed checkpoints go, and how to check them.
    """
    lines = [
        f"policy: {policy} ({roles} roles)",
        f"peers: {peers_file} ({peers} peer{'' if peers == 1 else 's'})",
    ]
    if agents_dir is None or not agents:
        where = f"in {agents_dir}" if agents_dir is not None else "(no agents directory)"
        lines.append(
            f"warning: no agent definitions {where}: no BCP channel is loaded; write some with "
            "`bcpbus init DIR` or pass --agents-dir"
        )
    else:
        described = ", ".join(f"{name} ({_channels_of(agent)})" for name, agent in agents.items())
        lines.append(f"agents: {agents_dir}: {described}")
    lines.append(f"gateway: {'in this process' if gateway else 'off'}")
    lines.append(f"activity log: {db} (SQLite, WAL)")
    lines.append(f"checkpoints: {checkpoints}")
    lines.append(f"log: {log_level.lower()} and above on stderr (-v: debug, --info: info)")
    lines.append("reload: on SIGHUP, and within a second of a change to these files")
    return lines


def _channels_of(agent: AgentDefinition) -> str:
    if not agent.bcp_channels:
        return "no channels"
    return ", ".join(f"{c.role} with {c.peer}" for c in agent.bcp_channels)
