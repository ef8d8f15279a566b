"""Tool calling for ``/v1/chat/completions``: what ``tool_choice`` asks of the engine, and the calls parsed from the
text.

- ``"none"``: the tools are not shown to the model; plain text comes back.
- ``"auto"`` (the default when ``tools`` is given): the chat template shows the tools;
  the output is parsed for calls, written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks (Hermes, Qwen) or as one bare JSON object ``{"name": ..., "arguments"|"parameters": {...}}``
  (Llama 3). Text outside the blocks stays the message's content.
- ``"required"``: the output is constrained (a JSON schema for the engine's grammar) to
  one call of one of the tools: ``{"name": <one of the names>, "arguments": <its parameters>}``.
- ``{"type": "function", "function": {"name": N}}``: the output is constrained to N's
  parameters; it comes back as a call of N.

Example:
    >>> calls, content = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', {"f"})
    >>> calls[0]["function"], content
    ({'name': 'f', 'arguments': '{"x": 1}'}, '')
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from maxfx.serve._errors import bad_request

__all__ = ["ToolPlan", "parse_tool_calls", "plan_tools"]

# Tool calls are written compactly (no free whitespace): a weak model cannot pad them past max_tokens.
_COMPACT = {"whitespace_flexible": False, "whitespace_pattern": None, "item_separator": ",", "key_separator": ":"}
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolPlan:
    """How a chat request uses its tools.

    Attributes:
        tools: the tools to show the chat template (None: none).
        schema: a JSON schema the output must follow (``required`` / named choices), or None.
        forced: the one function a named choice calls (its output is the arguments).
        names: every tool's name (what the parser accepts).
    """

    tools: list[dict[str, Any]] | None
    schema: dict[str, Any] | None
    forced: str | None
    names: set[str]

    @property
    def parses(self) -> bool:
        """The output may hold calls to parse (``auto`` or ``required``)."""
        return bool(self.names) and self.forced is None


def _functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not fn["name"]
        ):
            raise bad_request(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': str, 'parameters': {{...}}}}}}",
                param=f"tools[{i}]",
            )
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise bad_request(
                f"tools[{i}].function.parameters must be a JSON schema object", param=f"tools[{i}].function.parameters"
            )
        out[fn["name"]] = params
    return out


def plan_tools(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None) -> ToolPlan:
    """Check ``tools`` / ``tool_choice`` (400 naming the field) and decide what the engine and the parser do."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools; the request has none", param="tool_choice")
        return ToolPlan(None, None, None, set())
    functions = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan(None, None, None, set())
    if choice == "auto":
        return ToolPlan(tools, None, None, set(functions))
    if choice == "required":
        options = [
            {
                "type": "object",
                "properties": {"name": {"const": n}, "arguments": p},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for n, p in functions.items()
        ]
        schema = dict(options[0]) if len(options) == 1 else {"anyOf": options}
        return ToolPlan(tools, dict(schema, **{"x-guidance": _COMPACT}), None, set(functions))
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type", "function") == "function" else None
        if name not in functions:
            raise bad_request(
                f"tool_choice names function {name!r}, which is not in tools ({sorted(functions)})", param="tool_choice"
            )
        return ToolPlan(tools, dict(functions[name], **{"x-guidance": _COMPACT}), name, set(functions))
    raise bad_request(
        f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': {{'name': ...}}}}, got "
        f"{choice!r}",
        param="tool_choice",
    )


def _call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}


def _as_call(obj: Any, names: set[str]) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return _call(obj["name"], args)


def parse_tool_calls(text: str, names: set[str]) -> tuple[list[dict[str, Any]], str]:
    """The OpenAI ``tool_calls`` found in ``text`` (calls of unknown names are left as text) and the remaining
    content.
    """
    calls: list[dict[str, Any]] = []
    if "<tool_call>" in text:
        kept: list[str] = []
        last = 0
        for m in _BLOCK.finditer(text):
            try:
                call = _as_call(json.loads(m.group(1)), names)
            except json.JSONDecodeError:
                call = None
            if call is not None:
                calls.append(call)
                kept.append(text[last : m.start()])
                last = m.end()
        kept.append(text[last:])
        return calls, "".join(kept).strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return [], text
    items = obj if isinstance(obj, list) else [obj]
    parsed = [_as_call(o, names) for o in items]
    if parsed and all(c is not None for c in parsed):
        return parsed, ""  # type: ignore[return-value]
    return [], text


def forced_call(name: str, text: str) -> list[dict[str, Any]]:
    """The call of a named ``tool_choice``: the constrained output is its arguments."""
    return [_call(name, text)]
