"""The committed JSON Schemas match the models; docs/protocol.md and agents/ satisfy them.

Examples in docs/protocol.md carry a marker in the comment just above their fenced block::

    <!-- schema: jsonrpc.request, sendMessage.params at /params -->

naming the schemas (``schemas/json/<name>.json``) the block satisfies: a bare name applies to
the whole block, ``name at /json/pointer`` to the part the pointer (RFC 6901) designates.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from schemas import generate

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
DOCS = (DOC, ROOT / "docs" / "http.md")
"""The protocol reference and its HTTP binding page, whose examples are checked alike."""
SCHEMAS = ROOT / "schemas" / "json"
AGENTS = ROOT / "agents"

_MARKER = re.compile(r"^<!--\s*schema:\s*(?P<targets>.+?)\s*-->$")
_FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")


@dataclass(frozen=True)
class Example:
    """One fenced block of the doc: where it starts, its language, text and marker targets."""

    line: int
    lang: str
    text: str
    targets: tuple[tuple[str, str], ...]
    """(schema name, JSON pointer) pairs; the pointer ``""`` is the whole block."""

    @property
    def id(self) -> str:
        return f"line{self.line}-" + "+".join(name for name, _ in self.targets)


def _targets(spec: str) -> tuple[tuple[str, str], ...]:
    targets = []
    for part in spec.split(","):
        name, _, pointer = part.strip().partition(" at ")
        targets.append((name.strip(), pointer.strip()))
    return tuple(targets)


def _blocks(text: str) -> list[Example]:
    """Every fenced block of ``text`` with the marker right above it (empty targets if none)."""
    lines = text.splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        start = index
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        previous = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = _MARKER.match(previous.strip())
        blocks.append(
            Example(
                line=start + 1,
                lang=fence["lang"],
                text="\n".join(lines[start + 1 : end]),
                targets=_targets(marker["targets"]) if marker else (),
            )
        )
        index = end + 1
    return blocks


DOC_BLOCKS = [block for doc in DOCS for block in _blocks(doc.read_text(encoding="utf-8"))]
EXAMPLES = [block for block in DOC_BLOCKS if block.targets]


@cache
def _validator(name: str) -> Draft202012Validator:
    path = SCHEMAS / f"{name}.json"
    assert path.is_file(), f"no schema {name!r} ({path.relative_to(ROOT)})"
    return Draft202012Validator(json.loads(path.read_text(encoding="utf-8")))


def _resolve(document: Any, pointer: str) -> Any:
    value = document
    for token in pointer.split("/")[1:] if pointer else ():
        key = token.replace("~1", "/").replace("~0", "~")
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def _errors(name: str, instance: Any) -> list[str]:
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in _validator(name).iter_errors(instance)
    ]


def _frontmatter(path: Path) -> Any:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].strip() == "---", f"{path.name}: no frontmatter"
    end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---")
    return yaml.safe_load("\n".join(lines[1:end]))


# The committed files


def test_committed_schemas_match_the_models(tmp_path):
    """Regenerating into an empty folder gives exactly the committed files, byte for byte."""
    generate.write(tmp_path)
    fresh = {path.name: path.read_text(encoding="utf-8") for path in tmp_path.glob("*.json")}
    committed = {path.name: path.read_text(encoding="utf-8") for path in SCHEMAS.glob("*.json")}
    hint = "run: python -m schemas.generate"
    assert sorted(set(fresh) - set(committed)) == [], f"missing from schemas/json/; {hint}"
    assert sorted(set(committed) - set(fresh)) == [], f"not generated from any model; {hint}"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert stale == [], f"stale; {hint}"


def test_check_names_stale_missing_and_extra_files(tmp_path, capsys):
    """``--check`` exits 0 on a current folder, else 1 naming each file that differs."""
    generate.write(tmp_path)
    assert generate.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "envelope.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "bcp_query.json").unlink()
    (tmp_path / "old.json").write_text("{}\n", encoding="utf-8")
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for line in ("envelope.json: stale", "bcp_query.json: missing", "old.json: extra"):
        assert line in err
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert generate.check(tmp_path) == {}


def test_output_is_deterministic():
    """Two generations give the same text: sorted keys, a trailing newline."""
    first, second = generate.render(), generate.render()
    assert first == second
    for text in first.values():
        assert text.endswith("}\n")
        assert (
            json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            == text
        )


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.json")), ids=lambda p: p.stem)
def test_each_file_is_a_valid_schema(path):
    """Each committed file is itself a valid JSON Schema, draft 2020-12."""
    Draft202012Validator.check_schema(json.loads(path.read_text(encoding="utf-8")))


def test_schemas_refuse_what_the_models_refuse():
    """The schemas are not vacuous: extra keys, missing fields and bad enums are errors."""
    envelope = {
        "messageId": "m1",
        "type": "bcp_response",
        "from": "agent:researcher",
        "timestamp": "2026-11-21T20:22:35Z",
        "content": {},
    }
    assert _errors("envelope", envelope) == []
    assert _errors("envelope", {**envelope, "to": "agent:main"})
    assert _errors("envelope", {**envelope, "from": "nobody"})
    assert _errors("bcp_response", {"query_id": "q1"})
    assert _errors("bcp_query_failed", {"query_id": "q1", "error": "no_such_reason"})
    assert _errors("processMessage.result", {"status": "ok"})
    assert _errors("jsonrpc.request", {"jsonrpc": "2.0", "id": 1.5, "method": "ping"})
    assert _errors("peer_joined", {"clientId": "agent:w1", "roles": ["agent", "agent"]})
    assert _errors("peer_left", {"clientId": "agent:w1", "reason": "crashed"})


# docs/protocol.md


def test_every_json_example_names_its_schema():
    """Every JSON block in docs/protocol.md has a schema marker right above it."""
    unmarked = [block.line for block in DOC_BLOCKS if block.lang == "json" and not block.targets]
    assert unmarked == [], "JSON blocks without <!-- schema: ... --> at these lines"


def test_every_schema_has_an_example():
    """Each schema file is exemplified in docs/protocol.md at least once."""
    used = {name for example in EXAMPLES for name, _ in example.targets}
    assert sorted({path.stem for path in SCHEMAS.glob("*.json")} - used) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.id)
def test_doc_example_satisfies_its_schemas(example):
    """The block parses and each part its marker names satisfies that schema."""
    assert example.lang in ("json", "yaml"), f"cannot check a {example.lang!r} block"
    document = json.loads(example.text) if example.lang == "json" else yaml.safe_load(example.text)
    for name, pointer in example.targets:
        assert _errors(name, _resolve(document, pointer)) == [], f"{name} at {pointer or '/'}"


# agents/


@pytest.mark.parametrize("path", sorted(AGENTS.glob("*.md")), ids=lambda p: p.stem)
def test_agent_frontmatter_satisfies_agent_definition(path):
    """The frontmatter of each agent definition in agents/ satisfies agent_definition.json."""
    assert _errors("agent_definition", _frontmatter(path)) == []
