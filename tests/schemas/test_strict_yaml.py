"""Tests for schemas/strict_yaml.py: strict parsing and the one-line errors of load_model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import pytest
import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from schemas import strict_yaml
from schemas.strict_yaml import LoadError, load_model, validate


def _lowercase(value: Any) -> Any:
    if isinstance(value, str) and value != value.lower():
        strict_yaml.invalid(f"{value!r}: use lowercase")
    return value


@dataclass(frozen=True)
class Section:
    __pydantic_config__ = ConfigDict(extra="forbid")
    size: Annotated[StrictInt, Field(ge=0)] | None = 10
    seconds: Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)] | None = 1.0
    enabled: StrictBool = True


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tags: tuple[StrictStr, ...] = ()
    level: Literal["low", "high"] = "low"


class File(strict_yaml.VersionedFile):
    VERSION: ClassVar[int] = 3
    entries: dict[Annotated[str, BeforeValidator(_lowercase)], Entry] = {}
    section: Section = Section()


def error_of(text: str) -> LoadError:
    with pytest.raises(LoadError) as caught:
        load_model(File, text, source="f.yaml")
    return caught.value


def test_load_refuses_a_duplicate_key():
    """A mapping that repeats a key is a YAML error naming the key."""
    with pytest.raises(yaml.YAMLError, match="duplicate key 'a'"):
        strict_yaml.load("a: 1\na: 2\n")


def test_load_model_returns_the_model():
    """A file that fits its model comes back as an instance of it, dataclasses included."""
    text = "version: 3\nentries: {a: {tags: [x]}}\nsection: {size: null, seconds: 2}\n"
    loaded = load_model(File, text, source="f.yaml")
    assert loaded.entries["a"].tags == ("x",)
    assert loaded.section == Section(size=None, seconds=2.0)


def test_an_empty_document_stands_for_empty():
    """An empty document is validated as the value given by ``empty``."""
    assert load_model(Section, "# nothing\n", source="f.yaml", empty={}) == Section()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("a: [", "f.yaml: not valid YAML at line 1: "),
        ("a: 1\na: 2\n", "f.yaml: not valid YAML at line 2: duplicate key 'a'"),
        ("", "f.yaml: expected a mapping with keys entries, section, version"),
        ("entries: {}", "f.yaml: version: required; write `version: 3`"),
        ("version: 3.0", "f.yaml: version: 3.0 is not supported; use 3"),
        ("version: true", "f.yaml: version: True is not supported; use 3"),
        ("version: 3\nextra: 1", "f.yaml: extra: unknown key; expected one of entries, section"),
        ("version: 3\nsection: {sise: 1}", "f.yaml: section.sise: unknown key; expected one of"),
        ("version: 3\nsection: {size: -1}", "f.yaml: section.size: must not be negative"),
        ("version: 3\nsection: {size: 1.5}", "section.size: expected a whole number, got 1.5"),
        ("version: 3\nsection: {seconds: x}", "section.seconds: expected a number, got 'x'"),
        ("version: 3\nsection: {seconds: .nan}", "section.seconds: Input should be a finite"),
        (
            "version: 3\nsection: {enabled: null}",
            "section.enabled: expected true or false, got None",
        ),
        (
            "version: 3\nsection: []",
            "f.yaml: section: expected a mapping with keys enabled, seconds",
        ),
        ("version: 3\nentries: {a: 1}", "f.yaml: entries.a: expected a mapping with keys level"),
        ("version: 3\nentries: {a: {tags: x}}", "entries.a.tags: expected a list (write []"),
        ("version: 3\nentries: {a: {tags: [1]}}", "entries.a.tags[0]: expected a string, got 1"),
        ("version: 3\nentries: {a: {tags: [no]}}", "got False; YAML reads unquoted yes/no"),
        ("version: 3\nentries: {a: {level: mid}}", "entries.a.level: 'mid' is not one of"),
        ("version: 3\nentries: {a: {bad: 1}}", "entries.a.bad: unknown key; expected one of level"),
        ("version: 3\nentries: {A: {}}", "f.yaml: entries: 'A': use lowercase"),
        ("version: 3\nentries: {a: 1, b: 2}", "(and 1 more problems)"),
    ],
)
def test_errors_name_the_file_the_path_and_the_fix(text, error):
    """Each problem is one LoadError naming the file, the key path and what to write."""
    assert error in str(error_of(text))


def test_a_load_error_carries_its_parts():
    """LoadError keeps source, path and message apart, and is a ValueError."""
    error = error_of("version: 3\nsection: {size: -1}")
    assert isinstance(error, ValueError)
    assert (error.source, error.path, error.message) == (
        "f.yaml",
        "section.size",
        "must not be negative",
    )


def test_frontmatter_lines_count_from_first_line():
    """Embedded YAML reports lines of the enclosing file."""
    with pytest.raises(LoadError, match="at line 5"):
        load_model(Section, "a: 1\na: 2\n", source="a.md", first_line=4)


def test_invalid_blames_a_path_below_the_value():
    """A model validator names the field it blames through ``at``."""

    class Pair(BaseModel):
        low: int
        high: int

        @model_validator(mode="after")
        def _ordered(self) -> Pair:
            if self.low > self.high:
                strict_yaml.invalid("must not exceed high", at="low")
            return self

    with pytest.raises(LoadError) as caught:
        validate(dict[str, Pair], {"p": {"low": 2, "high": 1}}, source="s")
    assert str(caught.value) == "s: p.low: must not exceed high"


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int = 0


class Other(BaseModel):
    model_config = ConfigDict(extra="forbid")
    b: int = 0


@dataclass(frozen=True)
class Holder:
    __pydantic_config__ = ConfigDict(extra="forbid")
    maybe: Annotated[Inner, Field(description="optional")] | None = None
    either: Inner | Other | None = None


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"maybe": {"z": 1}}, "s: maybe.z: unknown key; expected one of a"),
        ({"either": {"z": 1}}, "unknown key"),
    ],
)
def test_known_keys_are_found_through_optional_and_annotated(data, error):
    """The keys of a mapping are listed through ``| None`` and Annotated, never guessed."""
    with pytest.raises(LoadError) as caught:
        validate(Holder, data, source="s")
    assert error in str(caught.value)
    assert "expected one of a, b" not in str(caught.value)
