"""Console sessions: who signed in with which token, and until when.

A session is kept in the bus's memory, never in the browser: the cookie holds only its id, a
256-bit random value. What a session holds (the peer's clientId and the token it signed in
with) is checked against the bus's credentials on every request (:meth:`Session.still_valid`),
so a token rotated or removed with ``bcpbus peers rotate|remove`` ends every session signed in
with it as soon as the bus has reloaded its peers file. A restart of the bus ends every session.

Each form carries the session's CSRF token (:attr:`Session.csrf`), compared in constant time
(:func:`same_secret`); the cookie is ``SameSite=Strict`` besides.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bus.ops.credentials import Credentials

__all__ = ["Session", "SessionSettings", "Sessions", "same_secret"]


@dataclass(frozen=True)
class SessionSettings:
    """How long sessions last and how many there may be.

    Args:
        idle: seconds without a request after which a session ends.
        lifetime: seconds after sign-in after which a session ends, used or not.
        max_sessions: sessions kept at most; a new one past it ends the least recently used.
    """

    idle: float = 30 * 60
    lifetime: float = 12 * 3600
    max_sessions: int = 1000


@dataclass
class Session:
    """One signed-in person."""

    id: str
    client_id: str
    token: str = field(repr=False)
    """The token signed in with, kept to act as its peer (a decision) and to notice a rotation."""
    csrf: str = field(repr=False)
    """Every form of this session carries it."""
    started: float
    used: float
    flash: list[tuple[str, str]] = field(default_factory=list)
    """``(kind, text)`` messages for the next page: ``ok`` or ``error``."""

    def still_valid(self, credentials: Credentials) -> bool:
        """Whether the bus still knows this session's token as this session's peer's."""
        record = credentials.identify(self.token)
        return record is not None and record.client_id == self.client_id


def same_secret(given: str | None, expected: str) -> bool:
    """Compare a submitted secret with the expected one in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class Sessions:
    """The console's sessions by id.

    Args:
        settings: timeouts and the cap.
        clock: seconds, monotonic; tests pass their own.
    """

    def __init__(
        self,
        settings: SessionSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or SessionSettings()
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def start(self, client_id: str, token: str) -> Session:
        """Open a session for ``client_id`` signed in with ``token``; set its id as the cookie."""
        while len(self._sessions) >= self.settings.max_sessions:
            oldest = min(self._sessions.values(), key=lambda s: s.used)
            del self._sessions[oldest.id]
        now = self._clock()
        session = Session(
            id=secrets.token_urlsafe(32),
            client_id=client_id,
            token=token,
            csrf=secrets.token_urlsafe(32),
            started=now,
            used=now,
        )
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None, *, touch: bool = True) -> Session | None:
        """The live session with this id, or None (unknown, or ended by a timeout now).

        ``touch`` counts this as use (a page); a live update stream does not keep a session
        from going idle.
        """
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._clock()
        limits = self.settings
        if now - session.used > limits.idle or now - session.started > limits.lifetime:
            del self._sessions[session_id]
            return None
        if touch:
            session.used = now
        return session

    def end(self, session_id: str) -> Session | None:
        """End a session; return it, or None if there was none."""
        return self._sessions.pop(session_id, None)
