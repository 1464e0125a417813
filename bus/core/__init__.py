"""Decisions and the wire: no sockets, no database, no awaits on I/O."""

__all__: list[str] = []
