"""Every command example in README.md and docs/*.md runs as printed, with real processes.

**The marker convention.** Each fenced ``sh``, ``console`` or ``python`` block (and ``bash``,
``shell``) in README.md or docs/*.md has an HTML comment on the line right above its fence:

- ``<!-- example: NAME -->`` runs it in the scenario NAME of that file. A scenario's blocks run
  in document order, in one empty temporary directory, so a later block sees the files, the
  variables and the background processes (one bus) of the earlier ones. Each file has its own
  scenarios; NAME is letters, digits and hyphens.
- ``<!-- example: skip REASON -->`` does not run it; REASON says why (it needs docker, a remote
  host, an MCP host, a person at the keyboard...). A skip without a reason is refused.

A runnable block without either marker fails :func:`test_every_runnable_block_is_marked`, so an
example added later is run or consciously skipped.

**How a shell block runs.** Lines joined by a trailing backslash are one command; each command
runs with ``bash -c`` and must exit 0, or the code its comment gives as ``exit N``
(``bcpbus peers add tg:42   # refused, exit 1: ...``). Beyond that, output shown in comments is
not compared. Special cases, all visible in the printed text:

- A command ending in ``&``, and every ``bcpbus serve``, starts in the background; the next
  command waits for its first line on stdout (``serve``: ``listening on``, and ``http on`` with
  ``--http-port``). Background processes get SIGTERM when the scenario ends.
- ``NAME=value`` and ``export NAME=value`` set a variable for the rest of the scenario;
  ``umask`` holds for the rest of it too.
- A ``curl`` command (not piped) must get a 2xx answer, or the status its comment starts with:
  ``# 403 {...}`` on its last line or on the comment line right after it.
- The port 8765 becomes a free port in every block (URLs, ``--port``, ``$BCPBUS_URL`` for the
  terminal tools), and 8080 another, so that a test never meets a bus someone else runs; a
  ``bcpbus serve`` without ``--port`` gets one, and ``bcpbus system``, ``chat``, ``approve``,
  ``gateway`` and ``mcp`` without ``--url`` get that bus's.

A ``python`` block runs as a program (``python -c``) in the same directory and environment. A
``console`` block runs its ``$ `` lines as commands. Checks beyond the exit codes, for the
scenarios whose output the text promises, are in :data:`CHECKS`; the state a scenario's text
assumes but does not make (a database holding the approval it shows) is made by :data:`SETUPS`.
The scenarios run side by side, :data:`PARALLEL` at a time, each with its own directory, ports
and bus.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from peers.testing import scaled
from tests.peers.test_approver import approval_row, make_approvals_db

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"sh", "bash", "shell", "console", "python"}
WS_PORT, HTTP_PORT = "8765", "8080"

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*example:\s*(.*?)\s*-->$")
_NAME = re.compile(r"^[A-Za-z0-9-]+$")
_ASSIGN = re.compile(r"""^(?:export\s+)?([A-Za-z_]\w*)=("[^"]*"|'[^']*'|\$\([^)]*\)|\S*)$""")
_EXIT = re.compile(r"\bexit (\d+)\b")
_CONNECTS = re.compile(r"(?:^|\|\s*)bcpbus (?:system|chat|approve|gateway|mcp)\b")
_STATUS = re.compile(r"^#?\s*(\d{3})\b")


# Reading the docs


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and the marker above it."""

    path: Path
    line: int
    lang: str
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        """The reason of a ``skip`` marker; '' for a skip without one; None when not skipped."""
        if self.marker is None or not re.match(r"^skip\b", self.marker):
            return None
        return self.marker[len("skip") :].strip()

    @property
    def scenario(self) -> str | None:
        """The scenario NAME of an ``example: NAME`` marker, else None."""
        if self.marker is None or self.skip_reason is not None:
            return None
        return self.marker if _NAME.match(self.marker) else None


def blocks(path: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of ``path`` (or of ``text``, read as if it were that file)."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        above = _MARKER.match(lines[index - 1].strip()) if index else None
        indent = len(fence.group(1))  # a block in a list item is indented with it
        body = "\n".join(line[indent:] for line in lines[index + 1 : end])
        found.append(Block(path, index + 1, fence.group(2), body, above and above.group(1)))
        index = end + 1
    return found


def runnable_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path) if b.lang in RUNNABLE]


def scenarios() -> dict[str, list[Block]]:
    """``file:NAME`` -> its blocks, in document order."""
    found: dict[str, list[Block]] = {}
    for block in runnable_blocks():
        if block.scenario is not None:
            found.setdefault(f"{block.path.name}:{block.scenario}", []).append(block)
    return found


def problems(found: list[Block]) -> list[str]:
    """What is wrong with the markers of ``found``: one line per block, naming it."""
    wrong = []
    for block in found:
        if block.marker is None:
            wrong.append(f"{block.where}: no <!-- example: NAME --> or <!-- example: skip WHY -->")
        elif block.skip_reason == "":
            wrong.append(f"{block.where}: a skip marker needs a reason")
        elif block.skip_reason is None and block.scenario is None:
            wrong.append(f"{block.where}: {block.marker!r} is not a scenario name")
    return wrong


# Splitting a shell block into commands


@dataclass
class Command:
    """One shell command as printed (continuation lines joined) and what it expects."""

    text: str
    code: str  # without the comment, one line
    comment: str
    after: list[str] = field(default_factory=list)  # comment lines right below it

    @property
    def exit_code(self) -> int:
        match = _EXIT.search(" ".join([self.comment, *self.after[:1]]))
        return int(match.group(1)) if match else 0

    @property
    def http_status(self) -> int | None:
        """The status a plain ``curl`` expects (None: any 2xx); not for other commands."""
        for comment in [self.comment, *self.after[:1]]:
            match = _STATUS.match(comment)
            if match:
                return int(match.group(1))
        return None

    @property
    def background(self) -> bool:
        return self.code.endswith("&") or self.code.startswith("bcpbus serve")


def commands(text: str, lang: str) -> list[Command]:
    """The commands of a shell block; for ``console``, those on ``$ `` lines."""
    found: list[Command] = []
    pending: list[str] = []
    for line in text.splitlines():
        if lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        pending.append(line)
        if line.endswith("\\"):
            continue
        joined = "\n".join(pending)
        pending = []
        code, comment = _split_comment(
            " ".join(p.removesuffix("\\").strip() for p in joined.splitlines())
        )
        if code:
            found.append(Command(joined, code, comment))
        elif comment and found:
            found[-1].after.append(comment)
    return found


def _split_comment(line: str) -> tuple[str, str]:
    """``code  # comment`` -> (code, comment), minding quotes as the shell does."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].strip(), line[index + 1 :].strip()
    return line.strip(), ""


# Running a scenario


@dataclass
class Run:
    """What one command or program printed."""

    command: str
    stdout: str
    stderr: str


class Scenario:
    """One scenario's directory, environment, ports and background processes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ports = {WS_PORT: str(free_port()), HTTP_PORT: str(free_port())}
        curl_home = directory.parent / f"{directory.name}-curl"
        curl_home.mkdir()
        # Every curl prints its status last, so a refused request is seen (curl -s exits 0).
        (curl_home / ".curlrc").write_text('write-out = "\\n%{http_code}\\n"\n')
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1",
            "BCPBUS_URL": f"ws://127.0.0.1:{self.ports[WS_PORT]}",
            "CURL_HOME": str(curl_home),
        }
        self.env.pop("BCPBUS_TOKEN", None)
        self.prelude: list[str] = []  # umask: holds for every later command
        self.background: list[tuple[subprocess.Popen[str], threading.Thread]] = []
        self.runs: list[Run] = []

    def run_block(self, block: Block) -> None:
        text = self.ports_of(block.text)
        if block.lang == "python":
            self.foreground(f"exec {sys.executable} -c {_quote(text)}", block.where, 0)
            return
        for command in commands(text, block.lang):
            self.run_command(command, block.where)

    def ports_of(self, text: str) -> str:
        for printed, port in self.ports.items():
            text = text.replace(printed, port)
        return text

    def run_command(self, command: Command, where: str) -> None:
        assign = _ASSIGN.match(command.code)
        if assign:
            name = assign.group(1)
            run = self.foreground(f'{command.code}\nprintf %s "${name}"', where, 0)
            self.env[name] = run.stdout
        elif command.code.startswith("umask "):
            self.prelude.append(command.code)
        elif command.background:
            self.start(command, where)
        else:
            run = self.foreground(self.url_of(command.text), where, command.exit_code)
            self.check_status(command, run, where)

    def url_of(self, text: str) -> str:
        """Give a command that connects to the bus and reads no ``$BCPBUS_URL`` the free port
        as ``--url``, unless it names one."""
        match = _CONNECTS.search(text)
        if match is None or "--url" in text:
            return text
        return f"{text[: match.end()]} --url {self.env['BCPBUS_URL']}{text[match.end() :]}"

    def foreground(self, script: str, where: str, expected: int) -> Run:
        result = subprocess.run(
            ["bash", "-c", "\n".join([*self.prelude, script])],
            cwd=self.directory,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
        shown = script if len(script) < 300 else script[:300] + "..."
        assert result.returncode == expected, (
            f"{where}: exit {result.returncode}, not {expected}: {shown}\n"
            f"stdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}"
        )
        run = Run(script, result.stdout, result.stderr)
        self.runs.append(run)
        return run

    def check_status(self, command: Command, run: Run, where: str) -> None:
        if not command.code.startswith("curl ") or "|" in command.code:
            return
        status = int(run.stdout.rstrip().rsplit("\n", 1)[-1])
        expected = command.http_status
        ok = status == expected if expected else 200 <= status < 300
        assert ok, f"{where}: HTTP {status}, not {expected or '2xx'}: {command.text}\n{run.stdout}"

    def start(self, command: Command, where: str) -> None:
        code = self.url_of(command.code.removesuffix("&").strip())
        if code.startswith("bcpbus serve") and "--port" not in code:
            code += f" --port {self.ports[WS_PORT]}"
        errors = self.directory.parent / f"background-{len(self.background)}.stderr"
        with errors.open("w") as stderr:
            process = subprocess.Popen(
                ["bash", "-c", "\n".join([*self.prelude, f"exec {code}"])],
                cwd=self.directory,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        lines: queue.Queue[str] = queue.Queue()
        pump = threading.Thread(target=_pump, args=(process, lines), daemon=True)
        pump.start()
        self.background.append((process, pump))
        ready = "http on" if "--http-port" in code else "listening on"
        wanted = ready if code.startswith("bcpbus serve") else ""
        while True:
            try:
                line = lines.get(timeout=scaled(30))
            except queue.Empty:
                pytest.fail(f"{where}: {code} printed no {wanted or 'line'!r} in time")
            assert line, f"{where}: {code} exited before it was ready: {errors.read_text()}"
            if wanted in line:
                return

    def close(self) -> None:
        for process, _ in self.background:
            process.send_signal(signal.SIGTERM)
        for process, pump in self.background:
            try:
                process.wait(timeout=scaled(30))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            pump.join(timeout=scaled(10))  # it has read to the end: the pipe can close
            assert process.stdout is not None
            process.stdout.close()


def _pump(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    """Move a background process's stdout to ``lines``; '' when it ends."""
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put("")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# What some scenarios must print, beyond exit codes


def _own_bus(runs: list[Run]) -> None:
    """The README's own-bus example: the Python program's message arrives, and the audit
    commands find it."""
    printed = "".join(run.stdout for run in runs)
    assert "agent got {'text': 'hello'}" in printed
    assert "delivered to 1 at epoch" in printed
    pub = next(run for run in runs if "bcpbus pub" in run.command)
    assert '"accepted": true' in pub.stdout  # agent:w1 has gone: deliveredTo 0
    audits = [run for run in runs if "bcpbus audit" in run.command]
    assert "agent:w1" in audits[0].stdout and "send_finish" in audits[0].stdout
    assert "send_finish" in audits[1].stdout and "tg:42" in audits[1].stdout


def _sdk(runs: list[Run]) -> None:
    """docs/bcp.md's program gets its push and its answer, which `audit --query` then shows."""
    program = next(run for run in runs if "asyncio.run(main())" in run.command)
    assert "pushed: {'has_breaking_news': True, 'priority': 'high'}" in program.stdout
    assert "{'has_breaking_news': False}" in program.stdout, program.stdout
    query = next(run for run in runs if "--query q-42" in run.command)
    assert "has_breaking_news" in query.stdout


def _walk_through(runs: list[Run]) -> None:
    """docs/http.md's pager is subscribed to presence when it lists its subscriptions."""
    listed = next(
        run
        for run in runs
        if run.command.startswith("curl -s http://127.0.0.1:")
        and "/v1/subscriptions" in run.command
    )
    assert '"topic":"system:presence"' in listed.stdout.replace(" ", ""), listed.stdout


def _try_it(runs: list[Run]) -> None:
    """docs/bootstrap.md's chat gets the echo agent started and each of its lines answered."""
    piped = next(run for run in runs if run.command.startswith("printf"))
    assert "echo 1: hello" in piped.stdout and "echo 2: how are you?" in piped.stdout, piped


CHECKS: dict[str, Callable[[list[Run]], None]] = {
    "README.md:own-bus": _own_bus,
    "bcp.md:sdk": _sdk,
    "bootstrap.md:try-it": _try_it,
    "http.md:walk-through": _walk_through,
}


# The state some scenarios' text assumes, made before their first block


def _pending_approval(directory: Path) -> None:
    """docs/approvals.md lists and shows ap-1f2e3d4c5b6a, pending in ./bcpbus.db."""
    make_approvals_db(directory / "bcpbus.db", [approval_row("ap-1f2e3d4c5b6a")])


def _repository_agents(directory: Path) -> None:
    """docs/bootstrap.md runs from the repository root, where serve and system read ./agents."""
    shutil.copytree(ROOT / "agents", directory / "agents")


def _demo_log(directory: Path) -> None:
    """docs/audit.md reads a log with BCP traffic in it: the demo's, with its query q-company."""
    subprocess.run(
        [str(Path(sys.executable).with_name("bcpbus")), "demo", "--yes", "--db", "bcpbus.db"],
        cwd=directory,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=True,
        timeout=scaled(120),
    )


SETUPS: dict[str, Callable[[Path], None]] = {
    "approvals.md:approve": _pending_approval,
    "audit.md:read": _demo_log,
    "bootstrap.md:try-it": _repository_agents,
    "bcp.md:risk": _repository_agents,
}


# The tests


def test_every_runnable_block_is_marked():
    """Every sh/console/python block in README.md and docs/ has an example or a skip marker
    with a reason, so no example goes untested unnoticed."""
    assert problems(runnable_blocks()) == []


def test_every_check_and_setup_names_a_scenario():
    """A scenario renamed in the docs cannot silently lose its checks or its setup."""
    assert set(CHECKS) | set(SETUPS) <= set(scenarios())


def test_an_unmarked_block_is_reported():
    """A block with no marker, a skip without a reason and a bad name are each named."""
    text = "\n".join(
        [
            "```sh",
            "bcpbus serve",
            "```",
            "<!-- example: skip -->",
            "```python",
            "pass",
            "```",
            "<!-- example: two words -->",
            "```console",
            "$ true",
            "```",
            "<!-- example: skip needs docker -->",
            "```sh",
            "docker compose up",
            "```",
        ]
    )
    found = blocks(ROOT / "docs" / "x.md", text)
    assert [b.lang for b in found] == ["sh", "python", "console", "sh"]
    assert problems(found) == [
        "docs/x.md:1: no <!-- example: NAME --> or <!-- example: skip WHY -->",
        "docs/x.md:5: a skip marker needs a reason",
        "docs/x.md:9: 'two words' is not a scenario name",
    ]


def test_commands_join_continuations_and_read_expectations():
    """Continuation lines make one command; comments give the exit code and HTTP status."""
    text = "\n".join(
        [
            "curl -s -X POST http://x/v1 \\",
            '  -d \'{"a": "#1"}\'',
            '# 403 {"error": ...}',
            "bcpbus peers add tg:42   # refused, exit 1: it has a token",
            "bcpbus serve &           # the bus",
        ]
    )
    first, second, third = commands(text, "sh")
    assert first.code == 'curl -s -X POST http://x/v1 -d \'{"a": "#1"}\''
    assert (first.http_status, first.exit_code) == (403, 0)
    assert (second.exit_code, second.background) == (1, False)
    assert third.background and third.code == "bcpbus serve &"
    assert [c.code for c in commands("$ bcpbus init x\nwrote x\n", "console")] == ["bcpbus init x"]


def run_scenario(name: str, directory: Path) -> list[Run]:
    """Run scenario ``name`` in ``directory``; return what each command printed."""
    directory.mkdir()
    if name in SETUPS:
        SETUPS[name](directory)
    scenario = Scenario(directory)
    try:
        for block in scenarios()[name]:
            scenario.run_block(block)
    finally:
        scenario.close()
    return scenario.runs


# The scenarios run side by side, a few at a time: most of their time is spent starting
# processes and waiting on them, and each has its own directory, ports and bus.
PARALLEL = 3


@pytest.fixture(scope="module")
def scenario_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[list[Run]]]]:
    """The selected scenarios, started together; each test waits for its own."""
    selected = [
        str(item.callspec.params["name"])
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_the_example_runs_as_printed"
    ]
    pool = ThreadPoolExecutor(PARALLEL)
    try:
        yield {
            name: pool.submit(run_scenario, name, tmp_path_factory.mktemp("example") / "work")
            for name in selected
        }
    finally:
        pool.shutdown(cancel_futures=True)  # after -x, the scenarios not started yet


@pytest.mark.parametrize("name", list(scenarios()))
def test_the_example_runs_as_printed(name, scenario_runs):
    """Every command of the scenario exits as the text says, in order, with real processes."""
    runs = scenario_runs[name].result(timeout=scaled(600))
    if name in CHECKS:
        CHECKS[name](runs)
