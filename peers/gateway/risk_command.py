"""``bcpbus agents check``: the risk report of a folder of agent definitions, and serve's verdicts.

The figures come from :mod:`peers.gateway.risk`; this module reads the folder, prints the report
as text or JSON (:class:`schemas.risk.RiskReport`) and picks the exit code.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bus.core.identities import default_agents_dir
from schemas.agents import load_agents
from schemas.risk import ChannelRisk, RiskReport, SpecRisk

from .risk import DEFAULT_MAX_UNSEALED_WORDS, report
from .settings import GatewaySettings

__all__ = [
    "EXIT_OVER_LIMIT",
    "add_agents",
    "check",
    "render",
    "say_verdicts",
    "verdict_lines",
]

EXIT_OVER_LIMIT = 1
"""``--strict``'s exit code when a channel lets too much unsealed text through (2: an error)."""


def add_agents(sub: Any) -> None:
    """Add ``bcpbus agents check``."""
    agents = sub.add_parser("agents", help="look at agent definitions")
    actions = agents.add_subparsers(dest="agents_command", metavar="ACTION", required=True)
    parser = actions.add_parser(
        "check",
        help="what each channel lets a reader put before its controller",
        description="For each channel, subscription and ad hoc query the definitions allow: "
        "the free text a reader can put in front of the controller's model per delivery and "
        "per budget (words, bits, unsealed fields), the timing bits, what Cat-1, a tighter "
        "format or sealing would save, and a one-line verdict. Exit 2 when the definitions are "
        "invalid; with --strict, 1 when a subscription lets more unsealed words through than "
        "--max-unsealed-words.",
    )
    parser.add_argument(
        "dir", nargs="?", type=Path, help="the agent definitions (default: what serve uses)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a channel is over the limit"
    )
    parser.add_argument(
        "--max-unsealed-words",
        type=int,
        default=DEFAULT_MAX_UNSEALED_WORDS,
        metavar="N",
        help="unsealed free-text words one delivery may carry under --strict "
        f"(default {DEFAULT_MAX_UNSEALED_WORDS}: a topic and a one-sentence finding)",
    )
    parser.add_argument(
        "--query-ttl",
        type=float,
        default=GatewaySettings().query_ttl,
        metavar="S",
        help="the gateway's query_ttl: how long a reader may choose when to answer "
        f"(default {GatewaySettings().query_ttl:g})",
    )
    parser.set_defaults(command=_check)


def check(
    directory: Path, *, query_ttl: float, max_unsealed_words: int = DEFAULT_MAX_UNSEALED_WORDS
) -> RiskReport:
    """Load ``directory`` and return its risk report.

    Raises:
        DefinitionError: a definition is invalid (a ValueError: the CLI prints it, exit 2).
        OSError: the folder cannot be read.
    """
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a folder of agent definitions")
    return report(
        load_agents(directory),
        agents_dir=str(directory),
        query_ttl=query_ttl,
        max_unsealed_words=max_unsealed_words,
    )


def _check(args: argparse.Namespace) -> int:
    if args.max_unsealed_words < 0:
        raise ValueError("--max-unsealed-words must be 0 or more")
    directory = args.dir or default_agents_dir()
    if directory is None:
        raise ValueError("no agent definitions: give DIR (no ./agents, no reference agents)")
    result = check(directory, query_ttl=args.query_ttl, max_unsealed_words=args.max_unsealed_words)
    print(result.model_dump_json(indent=2) if args.json else render(result), flush=True)
    return EXIT_OVER_LIMIT if args.strict and not result.passed else 0


def render(result: RiskReport) -> str:
    """The report as text: per channel, a table of its specs, then the verdicts."""
    lines = [
        f"agents: {result.agents_dir}; limit {result.max_unsealed_words} unsealed words a "
        f"delivery; timing at {result.observed_resolution_s * 1000:g} ms over a query_ttl of "
        f"{result.query_ttl_s:g} s"
    ]
    for channel in result.channels:
        lines += ["", *_channel_lines(channel)]
    lines += ["", "PASS" if result.passed else "FAIL: see the FAIL lines above"]
    return "\n".join(lines)


_HEADERS = ("spec", "cat", "unsealed fields", "words", "bits", "per budget", "timing", "saves")


def _channel_lines(channel: ChannelRisk) -> Iterator[str]:
    yield (
        f"{channel.channel} ({channel.controller_source}): max_category "
        f"{channel.max_category}, budget {channel.budget_bits:g} bits, anomaly_action "
        f"{channel.anomaly_action}"
    )
    rows = [_row(spec) for spec in channel.specs]
    widths = [max(len(r[i]) for r in (_HEADERS, *rows)) for i in range(len(_HEADERS))]
    for row in (_HEADERS, *rows):
        yield (
            "  "
            + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    for spec in channel.specs:
        yield f"  - {spec.verdict}"
    yield f"  {channel.verdict}"


def _row(spec: SpecRisk) -> tuple[str, ...]:
    kind = {"subscription": "push", "query_template": "template", "ad_hoc": "ad hoc"}[spec.kind]
    timing = "unbounded" if spec.timing_bits is None else f"{spec.timing_bits:.1f}"
    saving = spec.savings
    saves = (
        f"seal -{saving['sealing'].words}w; Cat-1 -{saving['cat1'].bits:.0f}b; "
        f"tighter -{saving['tighter'].words}w"
        if spec.unsealed_words
        else "-"
    )
    return (
        f"{spec.id} ({kind})",
        str(spec.category),
        ", ".join(spec.unsealed_fields) or "-",
        str(spec.unsealed_words),
        f"{spec.bits:.1f}",
        f"{spec.deliveries_per_budget} x = {spec.words_per_budget} words",
        timing,
        saves,
    )


def verdict_lines(directory: Path, *, query_ttl: float) -> list[str]:
    """The one-line verdict of each channel, for ``bcpbus serve`` to print at start.

    Returns an empty list when the folder has no channels; a definition error propagates (the
    gateway would refuse the same folder).
    """
    result = check(directory, query_ttl=query_ttl)
    return [f"risk: {channel.verdict}" for channel in result.channels]


def say_verdicts(directory: Path, query_ttl: float, say: Callable[[str], None]) -> None:
    """Print :func:`verdict_lines` through ``say`` (``bcpbus serve``'s stderr)."""
    for line in verdict_lines(directory, query_ttl=query_ttl):
        say(f"bcpbus: {line}")
