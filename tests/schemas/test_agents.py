import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from peers.gateway.bits import spec_bits
from schemas.agents import (
    DEFAULT_MAX_ESCALATIONS,
    AgentDefinition,
    DefinitionError,
    build_channels,
    check_agents,
    load_agents,
    parse_agent,
)

AGENTS_DIR = Path(__file__).resolve().parents[2] / "agents"

CONTROLLER: dict[str, Any] = {
    "name": "boss",
    "tools": "Read, BCPQuery",
    "bcp_channels": [
        {
            "peer": "reader",
            "role": "controller",
            "max_category": 2,
            "budget_bits": 1000,
            "max_cat2_queries": 10,
            "subscriptions": [
                {
                    "id": "findings",
                    "category": 2,
                    "questions": [
                        {
                            "id": "q1",
                            "question": "Topic?",
                            "max_words": 10,
                            "expected_format": "short_text",
                        },
                        {
                            "id": "q2",
                            "question": "Score?",
                            "max_words": 1,
                            "expected_format": "integer",
                        },
                    ],
                },
                {
                    "id": "alerts",
                    "category": 1,
                    "fields": [
                        {"name": "urgent", "type": "boolean"},
                        {"name": "level", "type": "integer", "min": 1, "max": 5},
                        {"name": "kind", "type": "enum", "values": ["a", "b"]},
                    ],
                },
            ],
        }
    ],
}
READER: dict[str, Any] = {
    "name": "reader",
    "bcp_channels": [{"peer": "boss", "role": "reader", "max_category": 2, "budget_bits": 1000}],
}


def document(frontmatter: dict[str, Any], body: str = "Prose.") -> str:
    return f"---\n{yaml.safe_dump(frontmatter, sort_keys=False)}---\n{body}\n"


def write(directory: Path, filename: str, frontmatter: dict[str, Any]) -> Path:
    path = directory / filename
    path.write_text(document(frontmatter), encoding="utf-8")
    return path


def parse_error(frontmatter: dict[str, Any], source: str = "agents/boss.md") -> DefinitionError:
    with pytest.raises(DefinitionError) as info:
        parse_agent(document(frontmatter), source=source)
    return info.value


def changed(
    path: tuple[str | int, ...], value: Any, base: dict[str, Any] = CONTROLLER
) -> dict[str, Any]:
    """Return a deep copy of ``base`` with the key at ``path`` (a tuple) set to ``value``."""
    data = copy.deepcopy(base)
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


# The reference pair


def test_reference_agents_load_cleanly():
    """agents/main.md and agents/researcher.md load and agree with each other; echo.md, the
    bootstrap flow's agent, loads beside them."""
    agents = load_agents(AGENTS_DIR)
    assert set(agents) == {"echo", "main", "researcher"}
    assert agents["echo"].command == ("python", "-m", "peers.examples.echo")
    assert agents["echo"].effective_taint == "none" and not agents["echo"].bcp_channels
    assert agents["main"].command is None
    assert agents["main"].effective_taint == "none"
    assert agents["researcher"].effective_taint == "high"
    assert agents["main"].body.startswith("# main")
    assert agents["researcher"].source.endswith("researcher.md")


def test_reference_subscriptions_charge_the_spec_bits():
    """research-findings is estimated at 671.0 bits (10 + 50 + 1 words, the seed's figure; the
    sealed finding is charged less once delivered) and research-alerts 3.0 bits."""
    channel = build_channels(load_agents(AGENTS_DIR))[("main", "researcher")]
    findings = channel.subscription("research-findings")
    alerts = channel.subscription("research-alerts")
    assert findings is not None and findings.questions is not None and alerts is not None
    assert [q.max_words for q in findings.questions] == [10, 50, 1]
    assert findings.sealed_keys() == {"finding"}
    assert spec_bits(findings) == 671.0
    assert spec_bits(alerts) == 3.0
    assert channel.subscription("unknown") is None


def test_reference_subscriptions_are_announced_in_the_seed_shape():
    """The reader's bcp_subscriptions_active entries have the spec's fields and nothing else."""
    channel = build_channels(load_agents(AGENTS_DIR))[("main", "researcher")]
    entries = [e.model_dump(mode="json", exclude_none=True) for e in channel.active_subscriptions()]
    assert [e["subscription_id"] for e in entries] == ["research-findings", "research-alerts"]
    assert set(entries[0]) == {"subscription_id", "controller", "category", "questions"}
    assert set(entries[1]) == {"subscription_id", "controller", "category", "fields"}
    assert entries[0]["controller"] == "main"
    assert set(entries[0]["questions"][0]) == {"id", "question", "max_words", "expected_format"}


# One file


def test_parse_agent_reads_frontmatter_and_body():
    """parse_agent returns the frontmatter as a model, with its source and prose body."""
    agent = parse_agent(document(CONTROLLER, "# Boss\n\nAsks questions."), source="boss.md")
    assert agent.name == "boss"
    assert agent.tools == ("Read", "BCPQuery")
    assert agent.source == "boss.md"
    assert agent.body == "# Boss\n\nAsks questions."
    assert agent.network == "none"
    assert agent.cron_schedules == ()


def test_tools_may_be_a_list():
    """tools is a comma-separated string (as in the seed) or a YAML list."""
    agent = parse_agent(document({**CONTROLLER, "tools": ["Read", "Grep"]}), source="x.md")
    assert agent.tools == ("Read", "Grep")


def test_seed_fields_are_optional_and_kept():
    """network, cron_schedules, description and model are accepted as the seed writes them."""
    data = {
        **READER,
        "network": "outbound",
        "description": "Searches.",
        "model": "some-model",
        "cron_schedules": [{"schedule": "0 */2 * * *", "message": "Check."}],
    }
    agent = parse_agent(document(data), source="reader.md")
    assert agent.network == "outbound"
    assert agent.cron_schedules[0].schedule == "0 */2 * * *"


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["python", "-m", "pkg.agent"], ("python", "-m", "pkg.agent")),
        ("node agent.mjs --name 'my agent'", ("node", "agent.mjs", "--name", "my agent")),
        (None, None),
    ],
)
def test_command_is_a_list_or_a_string_split_like_a_shell(command, words):
    """`command:` is a YAML list of words, or one string split as a shell would split it."""
    definition = parse_agent(document({"name": "a", "command": command}), source="a.md")
    assert definition.command == words


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ([], "a.md: command: give the program to run, e.g. [python, -m, mypackage.agent]"),
        ("  ", "a.md: command: give the program to run, e.g. [python, -m, mypackage.agent]"),
        ("run 'x", "a.md: command: cannot split the command into words: No closing quotation"),
        (["run", ""], "a.md: command: word 1 is empty or holds a NUL character"),
        (["run\x00"], "a.md: command: word 0 is empty or holds a NUL character"),
        (3, "a.md: command: expected a list of words, e.g. [python, -m, mypackage.agent]"),
        (["run", 3], "a.md: command[1]: expected a string, got 3"),
        (["x"] * 257, "a.md: command: "),
    ],
)
def test_a_bad_command_is_refused_in_words_an_operator_can_act_on(command, message):
    """An empty, unsplittable or mistyped `command:` is an error naming the file and the word."""
    error = parse_error({"name": "a", "command": command}, source="a.md")
    assert str(error).startswith(message)


def test_taint_defaults_by_role():
    """An agent with a reader channel is high by default; any other agent is none."""
    assert parse_agent(document(READER), source="r.md").effective_taint == "high"
    assert parse_agent(document(CONTROLLER), source="c.md").effective_taint == "none"
    medium = parse_agent(document({**READER, "taint": "medium"}), source="r.md")
    assert medium.effective_taint == "medium"


def test_channel_defaults():
    """anomaly_action defaults to reject, escalations to 2, max_cat2_queries to no limit."""
    channel = parse_agent(document(READER), source="r.md").bcp_channels[0]
    assert channel.anomaly_action == "reject"
    assert channel.max_escalations_per_task == DEFAULT_MAX_ESCALATIONS == 2
    assert channel.max_cat2_queries is None
    assert channel.subscriptions == ()


def test_channel_to_finds_a_channel_by_peer_and_role():
    """channel_to looks a channel up by peer, optionally by role."""
    agent = parse_agent(document(CONTROLLER), source="c.md")
    assert agent.channel_to("reader") is agent.bcp_channels[0]
    assert agent.channel_to("reader", "controller") is agent.bcp_channels[0]
    assert agent.channel_to("reader", "reader") is None
    assert agent.channel_to("nobody") is None
    assert agent.controller_channels == agent.bcp_channels
    assert agent.reader_channels == ()


def test_an_agent_built_in_code_names_itself_as_source():
    """A definition not parsed from a file still has a source for error messages."""
    assert AgentDefinition(name="x").source == "<agent x>"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: boss\n", "must start with a --- line"),
        ("---\nname: boss\n", "no closing --- line"),
        ("---\nname: [boss\n---\n", "not valid YAML"),
        ("---\n- boss\n---\n", "expected a mapping with keys"),
        ("---\n---\n", "expected a mapping with keys"),
        ("---\nname: boss\nname: other\n---\n", "YAML at line 3: duplicate key 'name'"),
    ],
)
def test_frontmatter_errors_name_the_file(text, message):
    """Missing, unclosed, invalid, non-mapping or duplicate-key frontmatter is an error."""
    with pytest.raises(DefinitionError) as info:
        parse_agent(text, source="agents/boss.md")
    assert str(info.value).startswith("agents/boss.md: frontmatter: ")
    assert message in str(info.value)


# Every DefinitionError names the file and the field path.

SUB = ("bcp_channels", 0, "subscriptions")
Q = (*SUB, 0, "questions")
F = (*SUB, 1, "fields")


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (
            changed((*SUB, 0), {"id": "s", "category": 3, "directive": "Sum up.", "max_words": 9}),
            "bcp_channels[0].subscriptions[0].category",
            "above the channel's max_category 2",
        ),
        (
            changed((*SUB, 1, "id"), "findings"),
            "bcp_channels[0].subscriptions[1].id",
            "duplicate subscription id",
        ),
        (
            changed((*Q, 1, "id"), "q1"),
            "bcp_channels[0].subscriptions[0].questions[1].id",
            "duplicate question id",
        ),
        (
            changed((*F, 1, "name"), "urgent"),
            "bcp_channels[0].subscriptions[1].fields[1].name",
            "duplicate field name",
        ),
        (
            changed((*Q, 0, "expected_format"), "free_text"),
            "bcp_channels[0].subscriptions[0].questions[0].expected_format",
            "'short_text'",
        ),
        (
            changed((*F, 2, "values"), []),
            "bcp_channels[0].subscriptions[1].fields[2].values",
            "at least one value",
        ),
        (
            changed((*F, 2), {"name": "kind", "type": "enum"}),
            "bcp_channels[0].subscriptions[1].fields[2].values",
            "at least one value",
        ),
        (
            changed((*F, 1, "min"), 9),
            "bcp_channels[0].subscriptions[1].fields[1].min",
            "greater than max",
        ),
        (
            changed(("bcp_channels", 0, "budget_bits"), 0),
            "bcp_channels[0].budget_bits",
            "greater than 0",
        ),
        (
            changed(("bcp_channels", 0, "budget_bits"), -5),
            "bcp_channels[0].budget_bits",
            "greater than 0",
        ),
        (
            changed(("bcp_channels", 0, "budget_bits"), "1000"),
            "bcp_channels[0].budget_bits",
            "number",
        ),
        (
            changed(("bcp_channels", 0, "max_cat2_queries"), -1),
            "bcp_channels[0].max_cat2_queries",
            "must not be negative",
        ),
        (
            changed(("bcp_channels", 0, "max_escalations_per_task"), -1),
            "bcp_channels[0].max_escalations_per_task",
            "must not be negative",
        ),
        (changed(("bcp_channels", 0, "max_category"), 4), "bcp_channels[0].max_category", "1"),
        (changed(("bcp_channels", 0, "role"), "boss"), "bcp_channels[0].role", "controller"),
        (
            changed(("bcp_channels", 0, "anomaly_action"), "ignore"),
            "bcp_channels[0].anomaly_action",
            "reject",
        ),
        (
            changed((*SUB, 0, "id"), "has space"),
            "bcp_channels[0].subscriptions[0].id",
            "pattern",
        ),
        (
            changed((*SUB, 0, "min_interval_s"), 0),
            "bcp_channels[0].subscriptions[0].min_interval_s",
            "greater than 0",
        ),
        (
            changed((*SUB, 0, "max_per_hour"), 0),
            "bcp_channels[0].subscriptions[0].max_per_hour",
            "greater than or equal to 1",
        ),
        (
            changed(("bcp_channels", 0, "peer"), "boss"),
            "bcp_channels[0].peer",
            "the agent itself",
        ),
        (changed(("bcp_channels", 0, "buget_bits"), 5), "bcp_channels[0].buget_bits", "unknown"),
        (changed(("bcp_channels", 0), {"peer": "reader"}), "bcp_channels[0].role", "required"),
        (changed(("name",), "bad name"), "name", "pattern"),
        (changed(("taint",), "extreme"), "taint", "none"),
        (changed(("colour",), "blue"), "colour", "unknown key"),
        (
            changed((*F, 2, "values"), [True, False]),
            "bcp_channels[0].subscriptions[1].fields[2].values[0]",
            "quote them",
        ),
        (
            changed((*SUB, 0, "fields"), [{"name": "x", "type": "boolean"}]),
            "bcp_channels[0].subscriptions[0].fields",
            "no fields",
        ),
    ],
)
def test_definition_errors_name_file_and_field(data, field, words):
    """Each inconsistency is a DefinitionError whose text names the file and the field path."""
    error = parse_error(data)
    assert error.source == "agents/boss.md"
    assert error.field == field
    assert str(error).startswith(f"agents/boss.md: {field}: ")
    assert words in error.message


def test_a_reader_channel_cannot_declare_subscriptions():
    """Subscriptions belong to the controller side only."""
    subscriptions = CONTROLLER["bcp_channels"][0]["subscriptions"]
    error = parse_error(changed(("bcp_channels", 0, "subscriptions"), subscriptions, READER))
    assert error.field == "bcp_channels[0].subscriptions"
    assert "only a controller channel" in error.message


def test_a_second_channel_with_the_same_peer_and_role_is_refused():
    """One agent declares at most one channel per (peer, role)."""
    channel = CONTROLLER["bcp_channels"][0]
    error = parse_error({**CONTROLLER, "bcp_channels": [channel, channel]})
    assert error.field == "bcp_channels[1].peer"


def test_a_reader_cannot_be_untainted():
    """An agent with a reader channel cannot declare taint none."""
    error = parse_error({**READER, "taint": "none"})
    assert error.field == "taint"


def test_definition_error_is_a_value_error():
    """DefinitionError is a ValueError carrying source, field and message."""
    error = DefinitionError("a.md", "name", "bad")
    assert isinstance(error, ValueError)
    assert (error.source, error.field, error.message) == ("a.md", "name", "bad")
    assert str(error) == "a.md: name: bad"


def test_multiple_problems_are_counted():
    """When a file has several problems the first is named and the others counted."""
    error = parse_error({"name": "boss", "colour": 1, "flavour": 2})
    assert "1 more problems" in error.message


# Files against each other


def test_load_agents_cross_checks_a_folder(tmp_path):
    """load_agents reads every *.md but README.md and returns definitions by name."""
    write(tmp_path, "boss.md", CONTROLLER)
    write(tmp_path, "reader.md", READER)
    (tmp_path / "README.md").write_text("# Agents\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not an agent", encoding="utf-8")
    agents = load_agents(tmp_path)
    assert list(agents) == ["boss", "reader"]
    assert agents["boss"].source == str(tmp_path / "boss.md")


def test_duplicate_agent_names_are_refused(tmp_path):
    """Two files with one agent name: the later file is named, the earlier one mentioned."""
    write(tmp_path, "a.md", READER)
    write(tmp_path, "b.md", READER)
    with pytest.raises(DefinitionError) as info:
        load_agents(tmp_path)
    assert info.value.source == str(tmp_path / "b.md")
    assert info.value.field == "name"
    assert str(tmp_path / "a.md") in info.value.message


def test_a_controller_channel_needs_the_readers_channel(tmp_path):
    """A controller channel without the reader's role: reader channel back is refused."""
    write(tmp_path, "boss.md", CONTROLLER)
    write(tmp_path, "reader.md", {"name": "reader"})
    with pytest.raises(DefinitionError) as info:
        load_agents(tmp_path)
    assert info.value.source == str(tmp_path / "boss.md")
    assert info.value.field == "bcp_channels[0]"
    assert "`role: reader`" in info.value.message


def test_a_reader_channel_needs_the_controllers_channel(tmp_path):
    """A reader channel without the controller's role: controller channel back is refused."""
    write(tmp_path, "boss.md", {"name": "boss"})
    write(tmp_path, "reader.md", READER)
    with pytest.raises(DefinitionError) as info:
        load_agents(tmp_path)
    assert info.value.source == str(tmp_path / "reader.md")
    assert "`role: controller`" in info.value.message


def test_matching_roles_are_required(tmp_path):
    """Two controller channels facing each other are not a channel."""
    write(tmp_path, "boss.md", CONTROLLER)
    write(tmp_path, "reader.md", changed(("bcp_channels", 0, "role"), "controller", READER))
    with pytest.raises(DefinitionError):
        load_agents(tmp_path)


def test_a_channel_to_an_undefined_agent_is_refused(tmp_path):
    """A channel whose peer has no definition is refused at its peer field."""
    write(tmp_path, "boss.md", CONTROLLER)
    with pytest.raises(DefinitionError) as info:
        load_agents(tmp_path)
    assert info.value.field == "bcp_channels[0].peer"
    assert "no agent named 'reader'" in info.value.message


def test_a_subscription_above_the_readers_max_category_is_refused(tmp_path):
    """The reader side may narrow max_category; a subscription above it is refused."""
    write(tmp_path, "boss.md", CONTROLLER)
    write(tmp_path, "reader.md", changed(("bcp_channels", 0, "max_category"), 1, READER))
    with pytest.raises(DefinitionError) as info:
        load_agents(tmp_path)
    assert info.value.source == str(tmp_path / "boss.md")
    assert info.value.field == "bcp_channels[0].subscriptions[0].category"
    assert "reader 'reader'" in info.value.message


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    """A definition file must be UTF-8."""
    (tmp_path / "bad.md").write_bytes(b"---\nname: \xff\n---\n")
    with pytest.raises(DefinitionError) as info:
        load_agents(tmp_path)
    assert "UTF-8" in info.value.message


def test_the_stricter_side_of_a_channel_holds(tmp_path):
    """The combined channel takes the stricter of both sides' settings."""
    controller = changed(("bcp_channels", 0, "anomaly_action"), "flag")
    controller["bcp_channels"][0]["max_escalations_per_task"] = 5
    reader = copy.deepcopy(READER)
    reader["bcp_channels"][0].update(
        budget_bits=500.5, max_cat2_queries=3, anomaly_action="review", max_escalations_per_task=1
    )
    agents = check_agents(
        [parse_agent(document(controller), source="c"), parse_agent(document(reader), source="r")]
    )
    channel = build_channels(agents)[("boss", "reader")]
    assert channel.budget_bits == 500.5
    assert channel.max_cat2_queries == 3
    assert channel.anomaly_action == "review"
    assert channel.max_escalations_per_task == 1
    assert channel.max_category == 2
    assert channel.reader_taint == "high"
    assert (channel.controller_source, channel.reader_source) == ("c", "r")


def test_channel_view_helpers():
    """A Channel knows its key, its topic and which categories it allows."""
    agents = check_agents(
        [parse_agent(document(CONTROLLER), source="c"), parse_agent(document(READER), source="r")]
    )
    channel = build_channels(agents)[("boss", "reader")]
    assert channel.key == ("boss", "reader")
    assert channel.topic == "bcp:boss:reader"
    assert [channel.allows(c) for c in (0, 1, 2, 3)] == [False, True, True, False]
    assert len(channel.subscriptions) == 2
