"""`bcpbus completion bash|zsh`: scripts generated from the argparse tree, loaded into real
shells and asked what completes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bus import cli as bus_cli
from bus.ops.completion import commands, script
from peers.cli import add_commands, gateway_beside
from peers.testing import scaled

BCPBUS = str(Path(sys.executable).with_name("bcpbus"))

COMPLETE = """
source <("$BCPBUS" completion bash) || exit 3
complete -p bcpbus
t() { COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); _bcpbus; echo "${COMPREPLY[*]}"; }
"""


def shell(program: str, text: str) -> list[str]:
    result = subprocess.run(
        [program, "-c", text],
        env={**os.environ, "BCPBUS": BCPBUS},
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout.splitlines()


def test_bash_completes_commands_options_and_choices():
    """Sourced into bash, the script registers `_bcpbus` and completes subcommands at each
    depth (options and their values skipped), options, and an option's choices."""
    lines = shell(
        "bash",
        COMPLETE
        + """
t bcpbus pe
t bcpbus peers r
t bcpbus --info audit --db x.db ver
t bcpbus serve --lo
t bcpbus audit --format ''
t bcpbus completion ''
t bcpbus audit --db ''
""",
    )
    assert lines == [
        "complete -o default -F _bcpbus bcpbus",
        "peers",
        "rotate remove",
        "verify",
        "--log-content --loop",
        "table json jsonl",
        "bash zsh",
        "",  # a file name: left to bash's default completion
    ]


def test_every_command_of_the_parser_is_in_the_script():
    """Each command path and each of its options appears in the generated tables, so the
    script cannot drift from the command line."""
    parser = bus_cli._parser(add_commands, gateway_beside)
    text = script(parser, "bash")
    found = list(commands(parser))
    assert {"serve", "peers add", "audit verify", "completion", "sub"} <= {c.path for c in found}
    for command in found:
        assert f'"{command.path}") printf "%s" "{" ".join(command.options)}"' in text
    serve = next(c for c in found if c.path == "serve")
    assert serve.values["--loop"] == ["auto", "asyncio", "uvloop"] and "--http-port" in serve.values
    with pytest.raises(ValueError, match="bash, zsh"):
        script(parser, "fish")


def find_zsh() -> str:
    program = shutil.which("zsh")
    if program is None:
        if os.environ.get("CI"):
            pytest.fail("CI: zsh is not installed (.ci/run installs it)")
        pytest.skip("zsh is not installed")
    return program


def test_zsh_registers_the_function_and_reads_the_same_tables():
    """Sourced into zsh after compinit, the script registers `_bcpbus` with compdef; its
    readers find the command path and what completes there as in bash, and `_bcpbus` hands
    zsh those words, or file names where there are none."""
    lines = shell(
        find_zsh(),
        """
emulate zsh
autoload -U compinit && compinit -u -D
source <("$BCPBUS" completion zsh) || exit 3
print -r -- "$_comps[bcpbus]"
print -r -- "$(_bcpbus_path --info peers --peers-file x add)"
print -r -- "$(_bcpbus_candidates "$(_bcpbus_path audit)" --format j)"
print -r -- "$(_bcpbus_candidates "$(_bcpbus_path peers)" peers r)"
print -r -- "$(_bcpbus_candidates "$(_bcpbus_path serve)" serve --no)"
# The completion function itself, with zsh's builtins stood in for (they need a widget).
compadd() { print -r -- "compadd $*"; }
_files() { print -r -- "_files"; }
t() { words=("$@"); CURRENT=$#words; _bcpbus; }
t bcpbus --info peers r
t bcpbus audit --format ''
t bcpbus audit --db ''
""",
    )
    assert lines[5:] == [
        "compadd -- add rotate list remove online",
        "compadd -- table json jsonl",
        "_files",
    ]
    assert lines[:4] == [
        "_bcpbus",
        "peers add",
        "table json jsonl",
        "add rotate list remove online",
    ]
    serve = lines[4].split()
    assert serve[:3] == ["-h", "--help", "--config"] and "--no-gateway" in serve
