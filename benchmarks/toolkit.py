"""Typed tools for τ²-bench-style tool-use games: a `Toolkit` of `@tool` methods and their schemas.

A game's tools are methods of a `Toolkit` subclass marked with `@tool` (`@tool(write=True)` for tools
that change the database). The OpenAI function schema of each tool is derived from its type hints and
its Google-style docstring, and `Toolkit.call(name, arguments)` validates arguments against that
schema strictly (no coercion: "12" is not 12) before running the method:

    class ShopTools(Toolkit):
        @tool
        def get_order(self, order_id: str) -> dict:
            '''Look up an order.

            Args:
                order_id: The order id, such as '#W0000001'.
            '''
            ...

    tools = ShopTools(db)
    tools.schemas()                                   # [{"type": "function", "function": {...}}]
    tools.call("get_order", {"order_id": "#W0000001"})  # compact JSON text, or ValueError

The episode loop that plays such tools is benchmarks/tool_env_game.py's `ToolEnvGame`.

Supported parameter types: str, int, float, bool, list[T], dict[str, T], Literal[...] (of str, int or
bool values) and Optional[T] / `T | None`. A problem in a tool definition (an unsupported type, a
parameter without an `Args:` entry) raises TypeError when the Toolkit subclass is created, so it
shows up at import time rather than mid-episode.
"""
from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union


# --------------------------------------------------------------------------------------------------
# The @tool decorator
# --------------------------------------------------------------------------------------------------
_TOOL_ATTR = "__storefront_tool__"


@dataclass(frozen=True)
class ToolMeta:
    """What `@tool` records on a method."""

    write: bool = False  # changes the database
    auth: bool = False  # identifies the user (an authentication look-up)
    ends_episode: bool = False  # a successful call ends the episode (e.g. a transfer to a human agent)


def tool(fn: Callable | None = None, *, write: bool = False, auth: bool = False,
         ends_episode: bool = False) -> Callable:
    """Mark a Toolkit method as a tool. `@tool` for read tools, `@tool(write=True)` for state changes,
    `@tool(auth=True)` for user look-ups that authenticate, `@tool(ends_episode=True)` for hand-offs."""

    def mark(method: Callable) -> Callable:
        if not callable(method):
            raise TypeError(f"@tool must decorate a method, got {method!r}")
        setattr(method, _TOOL_ATTR, ToolMeta(write=write, auth=auth, ends_episode=ends_episode))
        return method

    return mark(fn) if fn is not None else mark


# --------------------------------------------------------------------------------------------------
# Docstrings and type hints -> JSON schema + validators
# --------------------------------------------------------------------------------------------------
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTION_HEADERS = ("Args:", "Arguments:", "Returns:", "Raises:", "Yields:", "Example:", "Examples:", "Note:")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {argument name: description}).

    The description is the first paragraph with its lines joined; argument descriptions come from the
    `Args:` section (`name: text` or `name (type): text`, continuation lines indented further).
    """
    text = inspect.cleandoc(doc or "")
    lines = text.splitlines()
    first_paragraph: list[str] = []
    for line in lines:
        if not line.strip():
            break
        if line.strip() in _SECTION_HEADERS:  # a docstring whose summary runs straight into Args:
            break
        first_paragraph.append(line.strip())
    description = " ".join(first_paragraph)

    args: dict[str, str] = {}
    in_args = False
    arg_indent: int | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not in_args:
            if stripped in ("Args:", "Arguments:") and indent == 0:
                in_args = True
            continue
        if not stripped:
            continue
        if indent == 0:  # the next section (Returns:, Raises:, ...) ends the Args block
            break
        if arg_indent is None:
            arg_indent = indent
        match = _ARG_LINE.match(stripped)
        if indent == arg_indent and match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current is not None and indent > arg_indent:
            args[current] = f"{args[current]} {stripped}".strip()
    return description, args


_JSON_TYPE_OF = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _json_type_name(value: Any) -> str:
    """The JSON type name of a decoded JSON value (for error messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _short(value: Any) -> str:
    """A value as it would appear in JSON, cut to 40 characters (for error messages)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON-serialisable: only possible from a non-JSON caller
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


Validator = Callable[[Any, str], None]  # (value, path for messages) -> None or ValueError


def _is_optional(annotation: Any) -> tuple[bool, Any]:
    """(True, T) for Optional[T] / T | None, else (False, annotation)."""
    origin = typing.get_origin(annotation)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == len(typing.get_args(annotation)) - 1 and len(members) == 1:
            return True, members[0]
        raise TypeError(f"unsupported union type {annotation!r}: only Optional[T] is allowed")
    return False, annotation


def _schema_and_validator(annotation: Any, where: str) -> tuple[dict[str, Any], Validator]:
    """JSON schema and strict validator for one annotation. `where` names the parameter for errors."""
    optional, inner = _is_optional(annotation)
    if optional:
        schema, check_inner = _schema_and_validator(inner, where)

        def check_optional(value: Any, path: str) -> None:
            if value is not None:
                check_inner(value, path)

        return schema, check_optional

    origin = typing.get_origin(inner)
    if inner in (str, int, bool):
        expected = _JSON_TYPE_OF[inner]

        def check_scalar(value: Any, path: str) -> None:
            # bool is a subclass of int in Python, but not an integer in JSON.
            if type(value) is not inner:
                raise ValueError(f"{path} must be a JSON {expected}, got {_json_type_name(value)} {_short(value)}")

        return {"type": expected}, check_scalar
    if inner is float:

        def check_number(value: Any, path: str) -> None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{path} must be a JSON number, got {_json_type_name(value)} {_short(value)}")

        return {"type": "number"}, check_number
    if origin is Literal:
        values = typing.get_args(inner)
        kinds = {type(v) for v in values}
        if len(kinds) != 1 or next(iter(kinds)) not in (str, int, bool):
            raise TypeError(f"{where}: Literal values must all be str, all int or all bool, got {values!r}")
        expected = _JSON_TYPE_OF[next(iter(kinds))]

        def check_enum(value: Any, path: str) -> None:
            # type() check so that True does not pass for Literal[1].
            if not any(type(value) is type(v) and value == v for v in values):
                allowed = ", ".join(json.dumps(v) for v in values)
                raise ValueError(f"{path} must be one of {allowed}, got {_short(value)}")

        return {"type": expected, "enum": list(values)}, check_enum
    if origin is list:
        (item_type,) = typing.get_args(inner) or (None,)
        if item_type is None:
            raise TypeError(f"{where}: write list[T] with an item type, not a bare list")
        item_schema, check_item = _schema_and_validator(item_type, where)

        def check_list(value: Any, path: str) -> None:
            if not isinstance(value, list):
                raise ValueError(f"{path} must be a JSON array, got {_json_type_name(value)} {_short(value)}")
            for index, item in enumerate(value):
                check_item(item, f"{path}[{index}]")

        return {"type": "array", "items": item_schema}, check_list
    if origin is dict:
        key_type, value_type = typing.get_args(inner) or (None, None)
        if key_type is not str:
            raise TypeError(f"{where}: only dict[str, T] is supported, got {inner!r}")
        value_schema, check_value = _schema_and_validator(value_type, where)

        def check_dict(value: Any, path: str) -> None:
            if not isinstance(value, dict):
                raise ValueError(f"{path} must be a JSON object, got {_json_type_name(value)} {_short(value)}")
            for key, item in value.items():
                check_value(item, f"{path}[{json.dumps(key)}]")

        return {"type": "object", "additionalProperties": value_schema}, check_dict
    raise TypeError(f"{where}: unsupported parameter type {inner!r} (use str, int, float, bool, list[T], "
                    f"dict[str, T], Literal[...] or Optional[T])")


@dataclass
class ToolSpec:
    """A tool's schema plus what `Toolkit.call` needs to validate and run it."""

    name: str
    write: bool
    schema: dict[str, Any]
    required: tuple[str, ...]
    validators: dict[str, Validator]  # parameter name -> strict validator
    auth: bool = False
    ends_episode: bool = False


def tool_schema(method: Callable) -> dict[str, Any]:
    """OpenAI function schema of a tool method, derived from its type hints and docstring."""
    return _build_spec(method).schema


def _build_spec(method: Callable) -> ToolSpec:
    meta = getattr(method, _TOOL_ATTR, None)
    name = method.__name__
    description, arg_docs = parse_docstring(method.__doc__)
    if not description:
        raise TypeError(f"tool {name!r}: the docstring's first paragraph (the tool description) is empty")
    try:
        hints = typing.get_type_hints(method)
    except NameError as err:
        raise TypeError(f"tool {name!r}: cannot resolve a type hint ({err})") from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    validators: dict[str, Validator] = {}
    for param in inspect.signature(method).parameters.values():
        if param.name == "self":
            continue
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"tool {name!r}: parameter {param.name!r} must be a plain named parameter")
        if param.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {param.name!r} has no type hint")
        if param.name not in arg_docs:
            raise TypeError(f"tool {name!r}: parameter {param.name!r} is not described in the docstring's Args:")
        schema, validator = _schema_and_validator(hints[param.name], f"tool {name!r} parameter {param.name!r}")
        properties[param.name] = {**schema, "description": arg_docs[param.name]}
        validators[param.name] = validator
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    extra_docs = sorted(set(arg_docs) - set(validators))
    if extra_docs:
        raise TypeError(f"tool {name!r}: docstring describes unknown parameter(s) {extra_docs}")
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
    return ToolSpec(name=name, write=bool(meta and meta.write), schema=schema, required=tuple(required),
                    validators=validators, auth=bool(meta and meta.auth),
                    ends_episode=bool(meta and meta.ends_episode))


# --------------------------------------------------------------------------------------------------
# Toolkit
# --------------------------------------------------------------------------------------------------
def dump_compact(value: Any) -> str:
    """Compact, key-sorted JSON: the form tool results take in the conversation."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


class Toolkit:
    """Base class for a game's tools. Subclasses define `@tool` methods that act on `self.db`.

    Tool bodies raise ValueError for anything a real backend would refuse (unknown id, insufficient
    balance); `call` turns validation problems into ValueError too. Any other exception is a bug.
    """

    _specs: dict[str, ToolSpec] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        specs: dict[str, ToolSpec] = {}
        # Walk the MRO base-first so that subclasses can add or override tools; definition order is kept.
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                if callable(value) and getattr(value, _TOOL_ATTR, None) is not None:
                    specs[attr] = _build_spec(value)
                elif attr in specs:  # overridden without @tool: no longer a tool
                    del specs[attr]
        cls._specs = specs

    def __init__(self, db: Any) -> None:
        self.db = db

    @classmethod
    def tool_names(cls) -> list[str]:
        """Tool names in definition order."""
        return list(cls._specs)

    @classmethod
    def schemas(cls) -> list[dict[str, Any]]:
        """OpenAI function schemas of all tools (fresh copies, safe to modify)."""
        return [json.loads(json.dumps(spec.schema)) for spec in cls._specs.values()]

    @classmethod
    def is_write(cls, name: str) -> bool:
        """True for tools declared with `@tool(write=True)`; ValueError for an unknown name."""
        return cls._spec(name).write

    @classmethod
    def write_tools(cls) -> frozenset[str]:
        """Names of the tools that change the database."""
        return frozenset(name for name, spec in cls._specs.items() if spec.write)

    @classmethod
    def auth_tools(cls) -> frozenset[str]:
        """Names of the tools that identify the user."""
        return frozenset(name for name, spec in cls._specs.items() if spec.auth)

    @classmethod
    def ends_episode(cls, name: str) -> bool:
        """True for tools declared with `@tool(ends_episode=True)`; False for unknown names."""
        spec = cls._specs.get(name)
        return bool(spec and spec.ends_episode)

    @classmethod
    def _spec(cls, name: str) -> ToolSpec:
        spec = cls._specs.get(name)
        if spec is None:
            raise ValueError(f"unknown tool {name!r}; available tools: {', '.join(cls._specs)}")
        return spec

    def validate(self, name: str, arguments: Any) -> ToolSpec:
        """Check a call against the tool's schema; raise ValueError saying what is wrong."""
        spec = self._spec(name)
        if not isinstance(arguments, dict):
            raise ValueError(f"arguments of tool {name!r} must be a JSON object, got {_json_type_name(arguments)}")
        unknown = [key for key in arguments if key not in spec.validators]
        if unknown:
            raise ValueError(f"tool {name!r} got unexpected argument(s) {', '.join(map(repr, unknown))}; "
                             f"it takes: {', '.join(spec.validators) or 'no arguments'}")
        missing = [key for key in spec.required if key not in arguments]
        if missing:
            raise ValueError(f"tool {name!r} is missing required argument(s) {', '.join(map(repr, missing))}")
        for key, value in arguments.items():
            spec.validators[key](value, f"argument {key!r} of tool {name!r}")
        return spec

    def call(self, name: str, arguments: Any) -> str:
        """Validate and run a tool; return its result as text (str results verbatim, others compact JSON).

        Raises ValueError for an unknown tool, bad arguments or a refusal by the tool itself.
        """
        self.validate(name, arguments)
        result = getattr(self, name)(**arguments)
        return result if isinstance(result, str) else dump_compact(result)
