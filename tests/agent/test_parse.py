"""Parsing a reply's tool call: the JSON object is read before the closer is looked for."""

from __future__ import annotations

import pytest

from app.agent.parse import GENERIC, HERMES, LLAMA31, CallParseError, parse_call, split_call


def test_a_closer_inside_a_string_argument_stays_in_the_string():
    reply = 'Sure. <tool_call>{"name":"calculate","arguments":{"expression":"17 * 23}}}</tool_call> x"}}</tool_call>'
    text, raw = split_call(reply, GENERIC)
    call = parse_call(raw, GENERIC)
    assert text == "Sure. " and call.name == "calculate"
    assert call.arguments == {"expression": "17 * 23}}}</tool_call> x"}


def test_hermes_and_llama31_calls_parse():
    raw = split_call('<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>', HERMES)[1]
    assert parse_call(raw, HERMES).name == "now"
    raw = split_call('{"name": "now", "parameters": {"tz": "UTC"}}', LLAMA31)[1]
    assert parse_call(raw, LLAMA31).arguments == {"tz": "UTC"}


@pytest.mark.parametrize("reply, why", [
    ('<tool_call>{"name":"now","arguments":{}}', "no closing </tool_call>"),
    ('<tool_call>{"name":"now","arguments":{} junk</tool_call>', "not valid JSON"),
    ('<tool_call>{"name":"now","arguments":{}} trailing</tool_call>', "no closing </tool_call> after"),
    ('<tool_call>{"name":3}</tool_call>', 'string "name"'),
    ('<tool_call>{"name":"now","arguments":[1]}</tool_call>', '"arguments" must be a JSON object'),
])
def test_malformed_calls_say_what_is_wrong(reply, why):
    with pytest.raises(CallParseError, match=why):
        parse_call(split_call(reply, GENERIC)[1], GENERIC)
