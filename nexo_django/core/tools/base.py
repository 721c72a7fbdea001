"""What a tool is: a name, a JSON schema, the capability it needs, whether it is idempotent.

Every tool asks the gate before it touches anything. ``Denied`` becomes ``{"error": ...}`` for the
model; ``ApprovalRequired`` and ``SecurityError`` propagate to the loop.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from ..errors import ApprovalRequired, Denied, InputRequired, SecurityError, ToolArgumentError
from ..permissions import CAPABILITIES, Permissions
from .quick_schema import compile_check

if TYPE_CHECKING:
    from ..sandboxes.base import Sandbox

ToolResult = dict[str, Any]


@dataclass(frozen=True)
class Limits:
    """Caps applied by the built-in tools. ``NEXO["LIMITS"]`` overrides any of them."""

    read_max_bytes: int = 256 * 1024
    glob_max_entries: int = 1000
    glob_max_depth: int = 32
    glob_timeout: float = 5.0
    shell_timeout: float = 30.0
    shell_max_output: int = 64 * 1024
    # Caps of a confined shell command (docs/sandboxes.md); the same defaults as ShellPolicy's
    # (tests/test_shell_confine.py checks they agree).
    shell_memory: int = 2 * 1024**3
    shell_processes: int = 256
    shell_file_size: int = 1024**3
    shell_cpu_seconds: int = 60
    shell_tmp_size: int = 256 * 1024**2
    # The workspace around each confined shell call: bytes on disk and entries (docs/sandboxes.md).
    workspace_max_bytes: int = 4 * 1024**3
    workspace_max_entries: int = 100_000
    shell_ports: tuple[int, ...] = (80, 443)
    shell_allow_private: bool = False
    fetch_timeout: float = 20.0
    fetch_max_bytes: int = 2 * 1024 * 1024
    fetch_max_redirects: int = 5
    fetch_ports: tuple[int, ...] = (80, 443)
    fetch_allow_private: bool = False
    search_max_results: int = 10
    search_snippet_chars: int = 500
    result_max_chars: int = 100_000

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> Limits:
        """The limits ``values`` (``NEXO["LIMITS"]``) set; the same (immutable) object for a
        mapping of the same text as one seen before (every agent reads them when it is built)."""
        key = (cls, repr(values) if values else "")
        found = _from_mapping.get(key)
        if found is None:
            found = cls._from_mapping(values)
            if len(_from_mapping) >= 16:
                _from_mapping.clear()
            _from_mapping[key] = found
        return found

    @classmethod
    def _from_mapping(cls, values: Mapping[str, Any] | None) -> Limits:
        if not values:
            return cls()
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown limit(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        data = dict(values)
        for key in ("fetch_ports", "shell_ports"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)


_from_mapping: dict[tuple[type[Limits], str], Limits] = {}


@dataclass
class ToolContext:
    """Everything a tool may use while it runs. Built by the agent for each run."""

    sandbox: Sandbox
    permissions: Permissions
    limits: Limits = field(default_factory=Limits)
    #: normalised path -> version string last seen by ``read``/``write`` (read-before-write).
    versions: dict[str, str] = field(default_factory=dict)
    fetch_allow: tuple[str, ...] = ()
    search_backend: Callable[[str, int], Any] | None = None
    #: the id of the call being run, unique within the run: an idempotency key for tools
    call_id: str = ""
    #: the version of the call's file that the approver was shown ("": no file then), or None
    #: when no version went with the approval. An approval is the informed look that
    #: read-before-write stands for: ``write`` runs when the file is still that version.
    approved_version: str | None = None
    #: the answers to the input this call asked for before (``core.mcp_input.Answers``), or None
    answers: Any = None


def error(message: str) -> ToolResult:
    return {"error": message}


class Tool:
    """A callable the model can ask for. Subclass it, or use :func:`tool` on a function."""

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        *,
        capability: str,
        idempotent: bool,
        run: Callable[[dict[str, Any], ToolContext], Any] | None = None,
        detail: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if capability not in CAPABILITIES and capability != "mcp":
            raise ValueError(
                f"tool {name!r}: unknown capability {capability!r}; expected one of {', '.join(CAPABILITIES)}"
            )
        if run is None and type(self).execute is Tool.execute:
            raise TypeError(f"tool {name!r}: pass run=... or subclass Tool and override execute()")
        self.name = name
        self.description = description
        self.parameters = parameters
        self.capability = capability
        self.idempotent = idempotent
        self._run = run
        self._detail = detail
        Draft202012Validator.check_schema(parameters)
        # An explicit, empty registry: jsonschema would otherwise GET any remote "$ref" in a
        # schema, with no timeout, at every validation.
        self._validator = Draft202012Validator(parameters, registry=Registry())
        #: a quick check for a simple schema (True only for arguments jsonschema accepts)
        self._quick = compile_check(parameters)

    def __repr__(self) -> str:
        return f"<Tool {self.name} capability={self.capability}>"

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def validate(self, args: Any) -> dict[str, Any]:
        if not isinstance(args, dict):
            raise ToolArgumentError(f"{self.name}: arguments must be a JSON object, got {type(args).__name__}")
        if self._quick is not None and self._quick(args):
            return args
        try:
            problems = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        except Unresolvable as exc:
            raise ToolArgumentError(
                f"{self.name}: its input schema cannot be checked: it refers to {exc.ref!r}, which is never fetched"
            ) from exc
        if problems:
            raise ToolArgumentError(f"{self.name}: {argument_problem(problems[0])}")
        return args

    def detail(self, args: dict[str, Any]) -> Any:
        """What the gate (and ``ask_when``) sees of a call."""
        return self._detail(args) if self._detail else args

    def gate(self, args: dict[str, Any], ctx: ToolContext) -> None:
        ctx.permissions.authorize(self.capability, self.detail(args))

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        assert self._run is not None  # checked in __init__
        return self._run(args, ctx)

    def invoke(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Validate, ask the gate, run. Never raises for the model's mistakes."""
        try:
            args = self.validate(args)
            self.gate(args, ctx)
        except (ToolArgumentError, Denied) as exc:
            return error(str(exc))
        return self.run_gated(args, ctx)

    def run_gated(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run a call that already passed the gate."""
        try:
            result = self.execute(args, ctx)
        except (ApprovalRequired, SecurityError, InputRequired):
            raise
        except (ToolArgumentError, Denied) as exc:
            return error(str(exc))
        except Exception as exc:  # a tool bug or an OS error must not kill the run
            return error(f"{self.name} failed: {type(exc).__name__}: {exc}")
        return normalise_result(result)


def argument_path(path: Any) -> str:
    """``observations[0].contents``: the place of a value inside the arguments, as a person writes it."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def argument_problem(problem: Any) -> str:
    """One jsonschema error in words that name the nested field, not the top-level ones."""
    where = argument_path(problem.absolute_path)
    prefix = f"{where}." if where else ""
    instance = problem.instance
    if problem.validator == "required" and isinstance(instance, dict):
        missing = [str(r) for r in problem.validator_value if r not in instance]
        return f"missing required argument {', '.join(prefix + m for m in missing)}"
    if problem.validator == "additionalProperties" and isinstance(instance, dict):
        schema = problem.schema if isinstance(problem.schema, dict) else {}
        known = set(schema.get("properties") or {})
        patterns = [re.compile(p) for p in schema.get("patternProperties") or {}]
        extra = sorted(str(k) for k in instance if k not in known and not any(p.search(str(k)) for p in patterns))
        if extra:
            return f"unexpected argument {', '.join(prefix + e for e in extra)}"
    return f"argument {where or 'arguments'}: {problem.message}"


def normalise_result(result: Any) -> ToolResult:
    if isinstance(result, dict):
        return result
    return {"result": result}


# --- the @tool decorator -----------------------------------------------------------------

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_for(annotation: Any, where: str) -> dict[str, Any]:
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    origin = typing.get_origin(annotation)
    targs = typing.get_args(annotation)
    if origin is list:
        return {"type": "array", "items": _schema_for(targs[0], where) if targs else {}}
    if origin is dict or annotation is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"enum": list(targs)}
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in targs if a is not type(None)]
        if len(non_none) == 1:
            return {"anyOf": [_schema_for(non_none[0], where), {"type": "null"}]}
    raise TypeError(f"{where}: cannot make a JSON schema for annotation {annotation!r}")


def _takes_context(param: inspect.Parameter, hints: dict[str, Any]) -> bool:
    return param.name == "ctx" or hints.get(param.name) is ToolContext


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    capability: str | None = None,
    idempotent: bool | None = None,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Turn a typed function into a :class:`Tool`::

        @nexo_django.tool(capability="read")
        def word_count(path: str, ctx: ToolContext) -> dict: ...

    ``capability`` is required: it is what the gate decides on. A parameter named ``ctx`` (or
    annotated ``ToolContext``) receives the run's context and is not part of the schema.
    ``idempotent`` defaults to True for ``read``/``glob``/``search`` and False otherwise.
    """

    def wrap(func: Callable[..., Any]) -> Tool:
        tool_name = name or func.__name__
        if capability is None:
            raise TypeError(
                f"@tool {tool_name}: declare the capability it needs, e.g. @tool(capability='read')"
            )
        hints = typing.get_type_hints(func)
        signature = inspect.signature(func)
        properties: dict[str, Any] = {}
        required: list[str] = []
        ctx_name: str | None = None
        for param in signature.parameters.values():
            if _takes_context(param, hints):
                ctx_name = param.name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"@tool {tool_name}: *args/**kwargs cannot be described to a model")
            if param.kind is param.POSITIONAL_ONLY:
                # Arguments arrive by name from the model; a positional-only one could never be set.
                raise TypeError(f"@tool {tool_name}: parameter {param.name!r} is positional-only; drop the '/'")
            if param.name not in hints:
                raise TypeError(f"@tool {tool_name}: parameter {param.name!r} needs a type annotation")
            properties[param.name] = _schema_for(hints[param.name], f"@tool {tool_name}.{param.name}")
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
        schema = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        doc = inspect.getdoc(func) or ""

        def run(args: dict[str, Any], ctx: ToolContext) -> Any:
            # The context goes to the parameter that asked for it, whatever its name.
            return func(**args, **{ctx_name: ctx}) if ctx_name is not None else func(**args)

        return Tool(
            tool_name,
            description if description is not None else doc.split("\n\n")[0],
            schema,
            capability=capability,
            idempotent=idempotent if idempotent is not None else capability in ("read", "glob", "search"),
            run=run,
        )

    if fn is not None:
        return wrap(fn)
    return wrap
