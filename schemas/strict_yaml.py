"""YAML for files an operator writes: parsed strictly, checked by a model, reported in one line.

PyYAML keeps the last of two equal keys without a word. In a policy that would let a second
``reader:`` silently replace the first, in a peers file a second entry for a clientId, in an
agent definition a second ``budget_bits``. Every configuration file bcpbus reads goes through
:func:`load`, and then through :func:`validate` against a pydantic model (or a dataclass with a
``__pydantic_config__``) whose ``extra="forbid"`` makes a misspelt key an error, not a silent
default. Typical use::

    try:
        shape = strict_yaml.load_model(PeersFile, text, source="bcpbus-peers.yaml")
    except strict_yaml.LoadError as exc:
        raise CredentialsError(str(exc)) from exc   # "bcpbus-peers.yaml: peers.agent:x: ..."

A :class:`LoadError` names the file, the YAML path of the first bad key and what to do, such as
``bcpbus.yaml: limits.max_frame_bytes: must not be negative``. A validator that knows better
than pydantic what to say raises :func:`invalid`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NoReturn, TypeVar, cast

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

__all__ = [
    "LoadError",
    "StrictLoader",
    "VersionedFile",
    "invalid",
    "load",
    "load_model",
    "validate",
]

_T = TypeVar("_T")

_MAPPING_ERRORS = frozenset({"model_type", "dataclass_type", "dict_type"})
_UNKNOWN_KEY_ERRORS = frozenset({"extra_forbidden", "unexpected_keyword_argument"})
_BOOLEAN_HINT = "; YAML reads unquoted yes/no/on/off as booleans: quote them"


class StrictLoader(yaml.SafeLoader):
    """A :class:`yaml.SafeLoader` that refuses duplicate mapping keys."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: list[Any] = []  # a list: keys may be unhashable, which construct_mapping reports
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.append(key)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load(text: str) -> Any:
    """Parse ``text`` like :func:`yaml.safe_load`, but raise on a duplicate key.

    Raises:
        yaml.YAMLError: the text is not YAML, or a mapping repeats a key (the message names it
            and its line).
    """
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader


class LoadError(ValueError):
    """A file is not YAML or does not fit its model; translate it into the caller's error.

    Args:
        source: the file (or other origin) the text came from.
        path: the YAML path of the first bad key, such as ``roles.reader.send[0].types``;
            empty when the whole document is wrong.
        message: what is wrong and what to write instead.
    """

    def __init__(self, source: str, path: str, message: str) -> None:
        self.source = source
        self.path = path
        self.message = message
        super().__init__(source, path, message)

    def __str__(self) -> str:
        if self.path:
            return f"{self.source}: {self.path}: {self.message}"
        return f"{self.source}: {self.message}"


def invalid(message: str, *, at: str = "") -> NoReturn:
    """Refuse a value from a validator, with ``message`` as the whole explanation.

    Args:
        message: what is wrong, in words an operator can act on.
        at: a path below the validated value, such as ``subscriptions[1].id``, when a model
            validator blames one of its fields.
    """
    template = "{path}: {message}" if at else "{message}"
    raise PydanticCustomError("invalid_value", template, {"path": at, "message": message})


class VersionedFile(BaseModel):
    """Base of a file model whose ``version`` key must be :attr:`VERSION`, exactly.

    The check runs before the other keys are read: a file of another version may mean
    anything, so it is refused first. ``Literal[1]`` would take ``true`` and ``1.0``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    VERSION: ClassVar[int] = 1
    version: int

    @model_validator(mode="before")
    @classmethod
    def _check_version(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "version" not in data:
                invalid(f"required; write `version: {cls.VERSION}`", at="version")
            version = data["version"]
            if type(version) is not int or version != cls.VERSION:
                invalid(f"{version!r} is not supported; use {cls.VERSION}", at="version")
        return data


def load_model(
    model: type[_T], text: str, *, source: str, empty: object = None, first_line: int = 1
) -> _T:
    """Parse ``text`` with :func:`load` and check it with :func:`validate`.

    Args:
        model: a pydantic model, or a dataclass with ``__pydantic_config__``.
        text: the YAML.
        source: the file it came from; every error starts with it.
        empty: what an empty document stands for; ``{}`` when every key has a default.
        first_line: the file's line number of the text's first line, for error messages
            about YAML embedded in a bigger file.

    Raises:
        LoadError: the text is not YAML (the message gives the line) or does not fit
            ``model``.
    """
    try:
        data = load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + first_line}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise LoadError(source, "", f"not valid YAML{where}: {problem}") from exc
    return validate(model, empty if data is None else data, source=source)


def validate(model: type[_T], data: object, *, source: str) -> _T:
    """Check parsed YAML against ``model`` and return the instance it describes.

    Raises:
        LoadError: naming the first problem's path and how to fix it, and counting the others.
    """
    try:
        return cast(_T, _adapter(cast(Any, model)).validate_python(data))
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        path, message = _describe(errors[0], model)
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problems)"
        raise LoadError(source, path, message) from exc


@functools.cache
def _adapter(model: Any) -> TypeAdapter[Any]:
    return TypeAdapter(model)


def _describe(error: ErrorDetails, model: type[Any]) -> tuple[str, str]:
    """Return the YAML path and the operator's message for one pydantic error."""
    loc = list(error["loc"])
    if loc and loc[-1] == "[key]":
        loc = loc[:-2]  # a bad mapping key: blame the mapping that holds it
    path = _format_path(loc)
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if "message" in ctx:
        extra = str(ctx.get("path") or "")
        path = f"{path}.{extra}" if path and extra else path or extra
        return path, str(ctx["message"])
    if kind == "missing":
        message = "required"
    elif kind in _UNKNOWN_KEY_ERRORS:
        message = "unknown key" + _known_keys(model, loc[:-1], "; expected one of ")
    elif kind in _MAPPING_ERRORS:
        message = "expected a mapping" + _known_keys(model, loc, " with keys ")
    elif kind in ("list_type", "tuple_type"):
        message = "expected a list (write [] for none)"
    elif kind == "string_type":
        message = f"expected a string, got {value!r}"
    elif kind == "bool_type":
        message = f"expected true or false, got {value!r}"
    elif kind in ("int_type", "int_from_float"):
        message = f"expected a whole number, got {value!r}"
    elif kind == "float_type":
        message = f"expected a number, got {value!r}"
    elif kind == "literal_error":
        message = f"{value!r} is not one of {ctx['expected']}"
    elif kind == "greater_than_equal" and ctx.get("ge") == 0:
        message = "must not be negative"
    else:
        message = f"{error['msg']} (got {value!r:.60})"
    if isinstance(value, bool) and kind != "bool_type":
        message += _BOOLEAN_HINT
    return path, message


def _format_path(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _known_keys(model: type[Any], loc: Sequence[int | str], lead: str) -> str:
    """Return ``lead`` and the keys the mapping at ``loc`` takes, or "" if unknown."""
    node: Any = model
    for part in loc:
        node = _child(node, part)
    keys = _fields(node)
    return lead + ", ".join(sorted(keys)) if keys else ""


def _child(node: Any, part: int | str) -> Any:
    node = _unwrap(node)
    fields = _fields(node)
    if fields is not None:
        return fields.get(str(part))
    origin, args = typing.get_origin(node), typing.get_args(node)
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1]
    if origin in (tuple, list) and args:
        return args[0]
    return None


def _fields(node: Any) -> dict[str, Any] | None:
    node = _unwrap(node)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return {f.alias or name: f.annotation for name, f in node.model_fields.items()}
    if isinstance(node, type) and dataclasses.is_dataclass(node):
        hints = typing.get_type_hints(node, include_extras=True)
        return {f.name: hints[f.name] for f in dataclasses.fields(node) if f.init}
    return None


def _unwrap(node: Any) -> Any:
    """Strip ``Annotated`` and ``| None`` from a type, as pydantic's locations do."""
    while True:
        origin, args = typing.get_origin(node), typing.get_args(node)
        if origin is typing.Annotated:
            node = args[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [arg for arg in args if arg is not type(None)]
            if len(rest) != 1:
                return node
            node = rest[0]
        else:
            return node
