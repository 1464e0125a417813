"""The ``bcpbus`` command: the bus's commands, the peers' commands and the gateway beside the bus.

This is the one place that sees every layer, so the command line is assembled here:
:func:`bus.cli.main` brings ``serve``, ``init``, ``peers`` and ``audit``; this module adds
``approve`` (:mod:`peers.approver_cli`), ``gateway``, ``budget`` and ``demo``
(:mod:`peers.gateway.commands`), ``agents check`` (:mod:`peers.gateway.risk_command`), ``pub``,
``sub``, ``req`` and ``peers online`` (:mod:`peers.terminal`), and gives ``serve`` the gateway
to run beside the bus, which says each channel's risk verdict at start, with the console
(:mod:`peers.console`) when the HTTP binding is on. Every import but the console's is at the
top: a command that fails to import stops ``bcpbus`` with the error, it does not go missing;
the console needs the ``http`` extra, which ``serve`` asks for only with ``--http-port``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Sequence
from functools import partial
from pathlib import Path

from bus import cli as bus_cli
from bus.ops.config import ServeConfig
from bus.ops.reload import Reloader
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
    """What ``bcpbus serve`` runs beside the bus: the gateway, unless it is turned off or there
    are no agent definitions, and the console (docs/console.md) when the HTTP binding is on;
    None for neither.

    Raises:
        ConfigError: the config's ``gateway:`` section has an unknown key or a bad value.
    """
    settings = GatewaySettings.from_mapping(config.gateway, where=f"{config.source}: gateway")
    gateway = None
    if settings.enabled and config.agents_dir is not None:
        gateway = partial(_beside_with_verdicts, agents_dir=config.agents_dir, settings=settings)
    if config.http.port is None:
        return gateway
    return partial(
        _with_console, gateway, agents_dir=config.agents_dir, query_ttl=settings.query_ttl
    )


@contextlib.asynccontextmanager
async def _beside_with_verdicts(
    bus: Bus, reloader: Reloader, *, agents_dir: Path, settings: GatewaySettings
) -> AsyncIterator[Gateway]:
    """Run the gateway beside the bus, and say each channel's risk verdict once it runs
    (``bcpbus agents check`` has the whole report)."""
    async with run_beside(bus, reloader, agents_dir=agents_dir, settings=settings) as gateway:
        say_verdicts(agents_dir, settings.query_ttl, reloader.say)
        yield gateway


@contextlib.asynccontextmanager
async def _with_console(
    gateway: bus_cli.RunBeside | None,
    bus: Bus,
    reloader: Reloader,
    *,
    agents_dir: Path | None,
    query_ttl: float,
) -> AsyncIterator[object]:
    """The gateway (if any), and the console on the HTTP binding's port."""
    # Imported here: the console needs the http extra, like the binding it is served on.
    from .console import run_console

    async with contextlib.AsyncExitStack() as stack:
        running = (
            None if gateway is None else await stack.enter_async_context(gateway(bus, reloader))
        )
        console = run_console(bus, reloader, agents_dir=agents_dir, query_ttl=query_ttl)
        await stack.enter_async_context(console)
        yield running


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
