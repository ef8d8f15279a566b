"""Tool-choice planning and tool-call parsing of ``maxfx serve`` (pure functions, no server)."""

import json

import pytest

from maxfx.serve._errors import APIError
from maxfx.serve._tools import parse_tool_calls, plan_tools

TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    },
    {"type": "function", "function": {"name": "g"}},
]


def test_hermes_blocks_and_bare_json_are_parsed():
    calls, content = parse_tool_calls(
        'before <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> after', {"f", "g"}
    )
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("f", {"x": 1})]
    assert content == "before  after" and calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    calls, content = parse_tool_calls('{"name": "g", "parameters": {}}', {"f", "g"})
    assert calls[0]["function"] == {"name": "g", "arguments": "{}"} and content == ""
    two, _ = parse_tool_calls('[{"name": "f", "arguments": {"x": 2}}, {"name": "g", "arguments": {}}]', {"f", "g"})
    assert [c["function"]["name"] for c in two] == ["f", "g"]


def test_text_without_calls_stays_content():
    assert parse_tool_calls("just words", {"f"}) == ([], "just words")
    assert parse_tool_calls('{"name": "unknown", "arguments": {}}', {"f"})[0] == []
    assert parse_tool_calls("<tool_call>not json</tool_call>", {"f"})[0] == []


def test_plans():
    auto = plan_tools(TOOLS, None)
    assert auto.tools == TOOLS and auto.schema is None and auto.parses
    assert plan_tools(TOOLS, "none").tools is None
    required = plan_tools(TOOLS, "required")
    assert [o["properties"]["name"]["const"] for o in required.schema["anyOf"]] == ["f", "g"]
    named = plan_tools(TOOLS, {"type": "function", "function": {"name": "f"}})
    assert named.forced == "f" and named.schema["properties"] == {"x": {"type": "integer"}}


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (TOOLS, {"type": "function", "function": {"name": "h"}}, "tool_choice"),
        (None, "required", "tool_choice"),
        ([{"type": "function"}], None, "tools[0]"),
        (TOOLS, "sometimes", "tool_choice"),
    ],
)
def test_bad_tools_are_400_naming_the_field(tools, choice, param):
    with pytest.raises(APIError) as info:
        plan_tools(tools, choice)
    assert info.value.status == 400 and info.value.param == param
