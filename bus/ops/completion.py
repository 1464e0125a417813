"""Shell completion for ``bcpbus``, generated from its argparse tree: ``bcpbus completion bash``
and ``bcpbus completion zsh`` print a script to source.

The script is made from the parser the command line runs, so every command, option and choice
is completed as it is, with no list kept by hand. It has three parts: tables written as shell
``case`` statements (the subcommands and options of each command path, the choices of each
option that takes a value), two functions that read them (which command the words so far name;
what may come next), and the glue for one shell: bash's ``complete -F``, zsh's ``compdef``. Where
nothing is offered (an option's value without choices, a positional argument) the shell
completes file names.

Why generated rather than argcomplete: it adds no dependency, and ``bcpbus`` need not start (an
import of every layer) on each press of Tab.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["SHELLS", "Command", "commands", "script"]

SHELLS = ("bash", "zsh")
"""The shells :func:`script` writes for."""

_SAFE = re.compile(r"^[A-Za-z0-9_.:@%+=,/-]+$")
"""Words that need no quoting inside double quotes in either shell."""


@dataclass
class Command:
    """One command path (``""`` for ``bcpbus`` itself, ``"peers add"``) and what may follow."""

    path: str
    subcommands: list[str] = field(default_factory=list)
    """Its subcommands, and the choices of a positional argument (``completion``'s shells)."""
    options: list[str] = field(default_factory=list)
    values: dict[str, list[str]] = field(default_factory=dict)
    """Each option that takes a value: its choices, or [] (the shell completes files)."""


def commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Command]:
    """Every command path of ``parser``, depth first, with its subcommands and options."""
    command = Command(path)
    children: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                command.subcommands.append(name)
                children.append((name, sub))
        elif not action.option_strings:  # a positional: offered when it has choices
            command.subcommands += [str(c) for c in action.choices or () if _SAFE.match(str(c))]
        else:
            command.options += action.option_strings
            if action.nargs != 0:
                choices = [str(c) for c in action.choices or ()]
                for option in action.option_strings:
                    command.values[option] = [c for c in choices if _SAFE.match(c)]
    yield command
    for name, sub in children:
        yield from commands(sub, f"{path} {name}".strip())


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of :data:`SHELLS`).

    Raises:
        ValueError: an unknown shell.
    """
    if shell not in SHELLS:
        raise ValueError(f"no completion for {shell!r}: give one of {', '.join(SHELLS)}")
    name = parser.prog
    found = list(commands(parser))
    tables = "\n".join(_tables(found))
    glue = _BASH if shell == "bash" else _ZSH
    header = f"#compdef {name}\n" if shell == "zsh" else ""
    return (
        header + _HEAD.format(name=name, shell=shell) + tables + _READERS + glue.format(name=name)
    )


def _tables(found: list[Command]) -> Iterator[str]:
    yield '_bcpbus_subcommands() {\n    case "$1" in'
    for command in found:
        if command.subcommands:
            yield f'        "{command.path}") printf "%s" "{" ".join(command.subcommands)}" ;;'
    yield "    esac\n}\n"
    yield '_bcpbus_options() {\n    case "$1" in'
    for command in found:
        yield f'        "{command.path}") printf "%s" "{" ".join(command.options)}" ;;'
    yield "    esac\n}\n"
    yield '_bcpbus_values() {\n    case "$1|$2" in'
    for command in found:
        for option, choices in command.values.items():
            # "-" marks a value without choices: offer nothing, so the shell completes files.
            shown = " ".join(choices) or "-"
            yield f'        "{command.path}|{option}") printf "%s" "{shown}" ;;'
    yield "    esac\n}\n"


_HEAD = """\
# {shell} completion for {name}, generated from its command line by `{name} completion {shell}`.
# Load it in the shell's startup file:  source <({name} completion {shell})

"""

# The readers use only what bash and zsh share: case, for, local, printf.
_READERS = """
# The command path the words before the cursor name ("", "peers", "peers add", ...).
_bcpbus_path() {
    local cmd="" word
    for word in "$@"; do
        case "$word" in -*) continue ;; esac
        case " $(_bcpbus_subcommands "$cmd") " in
            *" $word "*) cmd="${cmd:+$cmd }$word" ;;
        esac
    done
    printf "%s" "$cmd"
}

# What may come next after PREV, the cursor at CUR, in command path CMD; nothing: files.
_bcpbus_candidates() {
    local values
    values="$(_bcpbus_values "$1" "$2")"
    if [ -n "$values" ]; then
        [ "$values" = "-" ] || printf "%s" "$values"
        return
    fi
    case "$3" in
        -*) _bcpbus_options "$1" ;;
        *) _bcpbus_subcommands "$1" ;;
    esac
}
"""

_BASH = """
_{name}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" cmd
    cmd="$(_bcpbus_path "${{COMP_WORDS[@]:1:COMP_CWORD-1}}")"
    COMPREPLY=($(compgen -W "$(_bcpbus_candidates "$cmd" "$prev" "$cur")" -- "$cur"))
}}
complete -o default -F _{name} {name}
"""

_ZSH = """
_{name}() {{
    local cmd
    local -a found
    cmd="$(_bcpbus_path "${{(@)words[2,CURRENT-1]}}")"
    found=(${{=$(_bcpbus_candidates "$cmd" "${{words[CURRENT-1]}}" "${{words[CURRENT]}}")}})
    if (( ${{#found}} )); then
        compadd -- "${{found[@]}}"
    else
        _files
    fi
}}
if (( $+functions[compdef] )); then
    compdef _{name} {name}
fi
"""
