"""Tool-call formats: how a model writes a call, and parsing a reply into (text, call).

- hermes  (Qwen2.5, Hermes): <tool_call>\\n{"name": "x", "arguments": {...}}\\n</tool_call>;
  results go back as a user message wrapped in <tool_response>.
- llama31 (Llama 3.1 JSON tool calling): the whole reply is {"name": "x", "parameters": {...}};
  results go back in the ipython role.
- generic (models without a tool template, e.g. SmolLM2): <tool_call>{"name":"x","arguments":{...}}</tool_call>,
  described in the system prompt; results go back in a "tool" message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class CallFormat:
    name: str
    opener: str  # "" = the call is the whole reply, starting with "{"
    closer: str
    args_key: str
    item_separator: str
    key_separator: str
    result_role: str
    result_prefix: str = ""
    result_suffix: str = ""

    def example(self) -> str:
        body = f'{{"name"{self.key_separator}"TOOL_NAME"{self.item_separator}"{self.args_key}"{self.key_separator}{{...}}}}'
        return f"{self.opener}{body}{self.closer}"


GENERIC = CallFormat("generic", "<tool_call>", "</tool_call>", "arguments", ",", ":", "tool")
HERMES = CallFormat("hermes", "<tool_call>\n", "\n</tool_call>", "arguments", ", ", ": ", "user",
                    "<tool_response>\n", "\n</tool_response>")
LLAMA31 = CallFormat("llama31", "", "", "parameters", ", ", ": ", "tool")
CALL_FORMATS = {f.name: f for f in (GENERIC, HERMES, LLAMA31)}


def call_format_for(chat_format: str, chat_template: str = "") -> CallFormat:
    """The model's own tool-call format where its chat template has one, else the generic one."""
    if chat_format == "llama3":
        return LLAMA31
    if chat_format == "chatml" and "<tool_call>" in chat_template:
        return HERMES
    return GENERIC


class CallParseError(ValueError):
    """The reply tried to call a tool but the call is not well formed."""


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: object
    raw: str


def split_call(text: str, fmt: CallFormat) -> tuple[str, str | None]:
    """(text before the call, the call's raw text from the opener on) or (text, None)."""
    if fmt.opener:
        i = text.find(fmt.opener.strip())
        return (text, None) if i < 0 else (text[:i], text[i:])
    stripped = text.lstrip()
    return ("", stripped) if stripped.startswith("{") else (text, None)


def parse_call(raw: str, fmt: CallFormat) -> ParsedCall:
    """Parse one call (as returned by split_call). Raises CallParseError saying what is wrong.

    The JSON object is read first and the closer looked for after it, so a closer written
    inside a string argument (e.g. "</tool_call>" in an expression) stays part of the string."""
    body = raw
    if fmt.opener:
        body = body.strip()[len(fmt.opener.strip()):]
    text = body.lstrip()
    try:
        obj, end = _DECODER.raw_decode(text)
    except json.JSONDecodeError as e:
        if fmt.opener and fmt.closer.strip() not in text:
            raise CallParseError(f"the tool call has no closing {fmt.closer.strip()}") from None
        raise CallParseError(f"the tool call is not valid JSON ({e})") from None
    if fmt.opener and not text[end:].lstrip().startswith(fmt.closer.strip()):
        raise CallParseError(f"the tool call has no closing {fmt.closer.strip()} after its JSON object")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise CallParseError('the tool call must be a JSON object with a string "name"')
    args = obj.get(fmt.args_key, {})
    if not isinstance(args, dict):
        raise CallParseError(f'"{fmt.args_key}" must be a JSON object')
    return ParsedCall(obj["name"], args, raw)


_DECODER = json.JSONDecoder()
