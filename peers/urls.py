"""A peer's bus URLs: one, or several to fail over between.

:class:`~peers.client.Peer` takes ``url`` as one URL, a list, or a comma-separated string
(``ws://a:8765,ws://b:8765``), which is what an environment variable or ``--url`` can carry.
:func:`bus_urls` reads all three forms the same way; :class:`UrlOption` lets a command line take
``--url`` several times, each adding a bus, as a comma list does.

The order is the order of preference: a peer connects to the first bus it reaches, and when
that connection drops it tries the next one first, then the others in turn, with the backoff
between attempts (see :class:`~peers.client.Peer`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .errors import InvalidURL

__all__ = ["UrlOption", "bus_urls"]


def bus_urls(url: str | Sequence[str]) -> tuple[str, ...]:
    """Return the bus URLs ``url`` names, in order, each once.

    Args:
        url: one URL, a sequence of them, or a comma-separated string; blanks are ignored.

    Raises:
        InvalidURL: it names no URL at all.
    """
    given = [url] if isinstance(url, str) else list(url)
    urls: dict[str, None] = {}  # a dict keeps the order and drops repeats
    for item in given:
        for part in item.split(","):
            if part.strip():
                urls[part.strip()] = None
    if not urls:
        raise InvalidURL(str(url), "no bus URL given")
    return tuple(urls)


class UrlOption(argparse.Action):
    """``--url`` that may be repeated: each one adds a bus, as a comma list does.

    The value stays one string (``ws://a,ws://b``) that :func:`bus_urls` and
    :class:`~peers.client.Peer` read; a given ``--url`` replaces the default rather than
    adding to it.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        previous = getattr(namespace, self.dest, None)
        value = str(values)
        # The default object itself is still there until the first --url: replace it.
        if previous is None or previous is self.default:
            setattr(namespace, self.dest, value)
        else:
            setattr(namespace, self.dest, f"{previous},{value}")
