"""The toolkit: plain typed functions → tool schemas, validation and guarded execution.

A tool is any Python function with type annotations; its docstring (up to an `Args:` section)
is the description, and the `Args:` lines describe the parameters. Supported parameter types:
str, int, float, bool, Literal[...] (an enum), list[str|int|float], Optional[X] / X | None, and
`Annotated[X, {schema hints}]` (e.g. {"maxLength": 2000}). A parameter without a default is
required. Strings get a maxLength (default 256) so constrained decoding always closes them, and
required strings a minLength of 1 (greedy decoding of a small model otherwise writes "").

Contracts
- `Toolkit.schemas` is sorted by name and fixed at construction: the prompt serialises it once.
- `Toolkit.call` never raises for the tool's faults: an unknown name, invalid arguments, an
  exception or a timeout becomes a ToolResult with ok=False and a message for the model.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import threading
import time
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

DEFAULT_MAX_LENGTH = 256


class ToolDefinitionError(ValueError):
    """A function cannot be a tool (missing annotation, unsupported type, no docstring)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object
    fn: Callable

    @property
    def schema(self) -> dict:
        """The tool's schema as the prompt shows it: {name, description, parameters}."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    content: str  # compact JSON (or the error message) as the model will read it
    elapsed_s: float


# ---- functions → schemas ---------------------------------------------------------------
_ARGS = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$", re.M)


def _split_doc(doc: str) -> tuple[str, dict[str, str]]:
    doc = inspect.cleandoc(doc)
    m = _ARGS.search(doc)
    if not m:
        return doc.strip(), {}
    described: dict[str, str] = {}
    current = None
    for line in doc[m.end():].splitlines():
        hit = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if hit:
            current = hit.group(1)
            described[current] = hit.group(2).strip()
        elif current and line.strip():
            described[current] += " " + line.strip()
    return doc[: m.start()].strip(), described


def type_schema(tp, where: str) -> tuple[dict, bool]:
    """(JSON schema, nullable) for one annotation."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        schema, nullable = type_schema(args[0], where)
        for hint in args[1:]:
            if isinstance(hint, dict):
                schema = schema | hint
        return schema, nullable
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return type_schema(rest[0], where)[0], True
        raise ToolDefinitionError(f"{where}: unions other than Optional[X] are not supported")
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if kinds <= {str}:
            return {"type": "string", "enum": list(args)}, False
        if kinds <= {int}:
            return {"type": "integer", "enum": list(args)}, False
        raise ToolDefinitionError(f"{where}: Literal values must all be str or all int")
    if origin in (list, tuple) or tp in (list, tuple):
        item = args[0] if args else str
        return {"type": "array", "items": type_schema(item, where)[0], "maxItems": 16}, False
    simple = {str: {"type": "string", "maxLength": DEFAULT_MAX_LENGTH}, int: {"type": "integer"},
              float: {"type": "number"}, bool: {"type": "boolean"}}
    if tp in simple:
        return dict(simple[tp]), False
    raise ToolDefinitionError(f"{where}: type {tp!r} is not supported")


def tool_from_function(fn: Callable, name: str | None = None) -> Tool:
    """Build a Tool from a typed, documented function (see module docstring)."""
    name = name or fn.__name__
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}", name):
        raise ToolDefinitionError(f"{name!r}: a tool name is an identifier of at most 64 characters")
    if not fn.__doc__:
        raise ToolDefinitionError(f"{name}: a tool needs a docstring (it is the tool's description)")
    description, described = _split_doc(fn.__doc__)
    hints = typing.get_type_hints(fn, include_extras=True)
    props: dict[str, dict] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolDefinitionError(f"{name}: *args / **kwargs are not supported")
        if p.name not in hints:
            raise ToolDefinitionError(f"{name}({p.name}): every parameter needs a type annotation")
        schema, nullable = type_schema(hints[p.name], f"{name}({p.name})")
        if p.name in described:
            schema["description"] = described[p.name]
        if p.default is inspect.Parameter.empty:
            if nullable:
                raise ToolDefinitionError(f"{name}({p.name}): an Optional parameter needs a default")
            required.append(p.name)
            if schema.get("type") == "string" and "enum" not in schema:
                schema.setdefault("minLength", 1)  # a small model's shortest call is otherwise ""
        elif p.default is not None:
            schema["default"] = p.default
        props[p.name] = schema
    params = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return Tool(name, description, params, fn)


def load_tools_dir(folder: str | Path) -> list[Callable]:
    """The public functions defined in each .py file of a user's tools folder (sorted by file)."""
    fns: list[Callable] = []
    for f in sorted(Path(folder).expanduser().glob("*.py")):
        if f.name.startswith("_"):
            continue
        mod_name = f"kvdeck_user_tools.{f.stem}"
        spec = importlib.util.spec_from_file_location(mod_name, f)
        if spec is None or spec.loader is None:
            continue
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
        for attr, value in vars(mod).items():
            if inspect.isfunction(value) and value.__module__ == mod_name and not attr.startswith("_"):
                fns.append(value)
    return fns


# ---- validation --------------------------------------------------------------------------
def validate(value, schema: dict, where: str = "arguments") -> None:
    """Raise ValueError when `value` does not satisfy the (subset of) JSON schema we emit."""
    kind = schema.get("type")
    ok = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }.get(kind, lambda v: True)
    if not ok(value):
        raise ValueError(f"{where}: expected {kind}, got {type(value).__name__}")
    if kind in ("integer", "number") and not schema.get("minimum", value) <= value <= schema.get("maximum", value):
        raise ValueError(f"{where}: {value} is outside [{schema.get('minimum', '-inf')}, {schema.get('maximum', 'inf')}]")
    if "enum" in schema and value not in schema["enum"]:
        raise ValueError(f"{where}: {value!r} is not one of {schema['enum']}")
    if kind == "string" and len(value) > schema.get("maxLength", 1 << 30):
        raise ValueError(f"{where}: longer than {schema['maxLength']} characters")
    if kind == "string" and len(value) < schema.get("minLength", 0):
        raise ValueError(f"{where}: shorter than {schema['minLength']} characters")
    if kind == "array":
        for i, item in enumerate(value):
            validate(item, schema.get("items", {}), f"{where}[{i}]")
    if kind == "object":
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            raise ValueError(f"{where}: missing required {', '.join(missing)}")
        extra = [k for k in value if k not in props]
        if extra and schema.get("additionalProperties") is False:
            raise ValueError(f"{where}: unknown {', '.join(extra)} (known: {', '.join(props) or 'none'})")
        for k, v in value.items():
            if k in props:
                validate(v, props[k], f"{where}.{k}")


# ---- the toolkit -------------------------------------------------------------------------
class Toolkit:
    """A fixed set of tools, sorted by name. Does not mutate after construction."""

    def __init__(self, fns: Iterable[Callable], timeout_s: float = 10.0, result_max_chars: int = 1500):
        tools = [f if isinstance(f, Tool) else tool_from_function(f) for f in fns]
        names = [t.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ToolDefinitionError(f"duplicate tool names: {', '.join(dupes)}")
        self.tools: dict[str, Tool] = {t.name: t for t in sorted(tools, key=lambda t: t.name)}
        self.timeout_s = timeout_s
        self.result_max_chars = result_max_chars

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def call(self, name: str, arguments) -> ToolResult:
        """Validate and run one call in a worker thread, bounded by timeout_s. Never raises."""
        t0 = time.perf_counter()

        def fail(msg: str) -> ToolResult:
            return ToolResult(False, f"error: {msg}", time.perf_counter() - t0)

        tool = self.tools.get(name)
        if tool is None:
            return fail(f"unknown tool {name!r} (known: {', '.join(self.tools)})")
        try:
            validate(arguments, tool.parameters)
        except ValueError as e:
            return fail(f"invalid arguments for {name}: {e}")
        box: dict = {}

        def work() -> None:
            try:
                box["value"] = tool.fn(**arguments)
            except BaseException as e:  # the tool's fault goes back to the model
                box["error"] = e

        worker = threading.Thread(target=work, name=f"tool-{name}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            return fail(f"{name} timed out after {self.timeout_s:g} s")
        if "error" in box:
            e = box["error"]
            return fail(f"{name} raised {type(e).__name__}: {e}")
        return ToolResult(True, self.render(box.get("value")), time.perf_counter() - t0)

    def render(self, value) -> str:
        """A result as the model reads it: strings as they are, the rest as compact sorted JSON."""
        if isinstance(value, str):
            text = value
        else:
            text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()
        if len(text) > self.result_max_chars:
            text = text[: self.result_max_chars] + f"… [truncated, {len(text)} chars]"
        return text
