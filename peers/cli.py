"""The ``bcpbus`` command: the bus's commands, the peers' commands and the gateway beside the bus.

This is the one place that sees every layer, so the command line is assembled here:
:func:`bus.cli.main` brings ``serve``, ``init``, ``peers`` and ``audit``; this module adds
``approve`` (:mod:`peers.approver_cli`), ``gateway``, ``budget`` and ``demo``
(:mod:`peers.gateway.commands`), ``agents check`` (:mod:`peers.gateway.risk_command`), ``pub``,
``sub``, ``req`` and ``peers online`` (:mod:`peers.terminal`), and gives ``serve`` the gateway
to run beside the bus, which says each channel's risk verdict at start. Every import is at the
top: a command that fails to import stops ``bcpbus`` with the error, it does not go
missing.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Sequence
from functools import partial
from pathlib import Path

from bus import cli as bus_cli
from bus.config import ServeConfig
from bus.reload import Reloader
from bus.server import Bus

from .approver_cli import add_approve
from .chat.cli import add_chat
from .gateway.commands import add_budget, add_demo, add_gateway
from .gateway.gateway import Gateway
from .gateway.risk_command import add_agents, say_verdicts
from .gateway.runner import run_beside
from .gateway.settings import GatewaySettings
from .mcp.command import add_mcp
from .system.cli import add_system
from .terminal import add_online, add_terminal

__all__ = ["add_commands", "gateway_beside", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``bcpbus`` command line; return the exit code."""
    return bus_cli.main(argv, extend=add_commands, beside=gateway_beside)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the BCP commands to the ``bcpbus`` parser's subparsers."""
    add_approve(sub)
    add_gateway(sub)
    add_budget(sub)
    add_demo(sub)
    add_agents(sub)
    # The bootstrap flow's two ends (docs/bootstrap.md).
    add_system(sub)
    add_chat(sub)
    add_terminal(sub)
    add_online(bus_cli.actions_of(sub.choices["peers"]))
    # MCP hosts as peers (docs/mcp.md).
    add_mcp(sub)


def gateway_beside(config: ServeConfig) -> bus_cli.RunBeside | None:
    """The gateway that ``bcpbus serve`` runs beside the bus, or None when it is turned off or
    there are no agent definitions.

    Raises:
        ConfigError: the config's ``gateway:`` section has an unknown key or a bad value.
    """
    settings = GatewaySettings.from_mapping(config.gateway, where=f"{config.source}: gateway")
    if not settings.enabled or config.agents_dir is None:
        return None
    return partial(_beside_with_verdicts, agents_dir=config.agents_dir, settings=settings)


@contextlib.asynccontextmanager
async def _beside_with_verdicts(
    bus: Bus, reloader: Reloader, *, agents_dir: Path, settings: GatewaySettings
) -> AsyncIterator[Gateway]:
    """Run the gateway beside the bus, and say each channel's risk verdict once it runs
    (``bcpbus agents check`` has the whole report)."""
    async with run_beside(bus, reloader, agents_dir=agents_dir, settings=settings) as gateway:
        say_verdicts(agents_dir, settings.query_ttl, reloader.say)
        yield gateway


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
