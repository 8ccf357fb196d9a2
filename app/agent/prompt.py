"""The canonical prompt, kept as token ids and only ever appended to.

    [system: static text] [tools: schemas sorted by name, compact JSON, sorted keys]
    [history: user / assistant / tool messages, each encoded once] [new user message + dynamic data]
    [assistant header: the generation point]

Each piece is tokenised once, on its own (ChatFormat.message_ids / assistant_prefix), and the
ids are concatenated: the history is never re-rendered nor re-tokenised. An assistant reply
enters the history as the exact ids the model generated, so the next request extends the
previous request + its output token for token (what a prefix cache can reuse).

Contracts
- `CanonicalPrompt` owns `ids` and `segments`; add_* methods mutate by appending only.
  `replace_system` (the broken demo: a timestamp in the system prompt) is the one exception.
- `request()` does not mutate: it returns ids + the assistant header.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

import orjson

from app.agent.parse import CallFormat
from app.engine.chat_format import ChatFormat, Message

SYSTEM_PROMPT = (
    "You are kvdeck, the operations assistant that runs on this device (an NVIDIA Jetson or a Linux box). "
    "You help an operator check the device, look things up in the local notes, do arithmetic, read workspace "
    "files and prepare emails and reminders (they are drafted, never sent). Answer briefly and plainly. "
    "Use a tool when the answer needs device data, the notes, arithmetic, files or the outbox; "
    "never invent a tool result."
)


def tools_json(schemas: list[dict]) -> str:
    """The tool schemas as the prompt shows them: sorted by name, compact JSON, sorted keys."""
    ordered = sorted(schemas, key=lambda s: s["name"])
    return orjson.dumps(ordered, option=orjson.OPT_SORT_KEYS).decode()


def tools_block(schemas: list[dict], fmt: CallFormat) -> str:
    """The static tools section of the system message."""
    if fmt.opener:
        how = (f"To call a tool, reply with only {fmt.example()} and nothing else. "
               "The result comes back in the next message; then answer the operator using it.")
    else:
        how = (f"To call a tool, reply with only the JSON {fmt.example()}. "
               "The result comes back in the next message; then answer the operator using it.")
    return f"# Tools\n{how}\nAvailable tools (JSON schemas):\n{tools_json(schemas)}"


@dataclass(frozen=True)
class Segment:
    name: str  # system | tools | history[i]:role | user
    start: int
    end: int
    digest: str  # blake2b of the ids, 16 hex chars

    def __len__(self) -> int:
        return self.end - self.start


def digest(ids: list[int]) -> str:
    return hashlib.blake2b(orjson.dumps(ids), digest_size=8).hexdigest()


class CanonicalPrompt:
    """One conversation's prompt as token ids; owned by one agent; appended to, never re-rendered."""

    def __init__(self, chat: ChatFormat, calls: CallFormat, schemas: list[dict], system_prompt: str = SYSTEM_PROMPT):
        self.chat = chat
        self.calls = calls
        self.system_prompt = system_prompt
        self.tools_text = tools_block(schemas, calls)
        self.ids: list[int] = []
        self.segments: list[Segment] = []
        self._roles: list[str] = []
        header = chat.encode(chat.assistant_prefix())
        whole = chat.prompt_ids([])  # e.g. <|begin_of_text|> for Llama 3, nothing for ChatML
        self._preamble = whole[: len(whole) - len(header)]
        self._header = header
        rendered = chat.render(Message("assistant", ""))
        prefix = chat.assistant_prefix()
        self._closing = chat.encode(rendered[len(prefix):]) if rendered.startswith(prefix) else []
        self._put_system(system_prompt)

    # ---- building -------------------------------------------------------------------------
    def _put_system(self, system_prompt: str) -> None:
        """system + tools as two segments: the system message is split where the tools text starts."""
        rendered = self.chat.render(Message("system", f"{system_prompt}\n\n{self.tools_text}"))
        cut = rendered.index(self.tools_text)
        sys_ids = self._preamble + self.chat.encode(rendered[:cut])
        tool_ids = self.chat.encode(rendered[cut:])
        self.ids = sys_ids + tool_ids
        self.segments = [Segment("system", 0, len(sys_ids), digest(sys_ids)),
                         Segment("tools", len(sys_ids), len(self.ids), digest(tool_ids))]
        self._roles = []

    def _append(self, role: str, ids: list[int]) -> None:
        start = len(self.ids)
        self.ids += ids
        self._roles.append(role)
        self.segments.append(Segment(f"history[{len(self._roles) - 1}]:{role}", start, len(self.ids), digest(ids)))

    def add_user(self, text: str, now: datetime | None = None, turn: int | None = None) -> None:
        """The new user message; all dynamic data (time, ids) goes here, at the end of the prompt."""
        tags = []
        if now is not None:
            tags.append(f"time {now.isoformat(timespec='seconds')}")
        if turn is not None:
            tags.append(f"turn {turn}")
        content = (f"[{' · '.join(tags)}]\n" if tags else "") + text
        self._append("user", self.chat.message_ids(Message("user", content)))

    def add_assistant(self, output_ids: list[int]) -> None:
        """The reply exactly as generated: header + output ids + the format's closing ids."""
        self._append("assistant", self._header + list(output_ids) + self._closing)

    def add_tool_result(self, content: str) -> None:
        c = self.calls
        msg = Message(c.result_role, f"{c.result_prefix}{content}{c.result_suffix}")
        self._append("tool", self.chat.message_ids(msg))

    def replace_system(self, system_prompt: str) -> None:
        """Re-render the system segment (what a naive agent does with a timestamp). Breaks the prefix."""
        tail = self.ids[self.segments[1].end:]
        old = self.segments[2:]
        self._put_system(system_prompt)
        shift = len(self.ids) - old[0].start if old else 0
        self.ids += tail
        for s in old:
            self.segments.append(Segment(s.name, s.start + shift, s.end + shift, s.digest))
            self._roles.append(s.name.split(":")[1])
        self.system_prompt = system_prompt

    # ---- reading --------------------------------------------------------------------------
    def request(self) -> tuple[list[int], list[Segment]]:
        """The ids of the next engine call (history + assistant header) and their segments.

        The latest user message is named "user"; the header is the "assistant" segment.
        """
        segs = list(self.segments)
        for i in range(len(segs) - 1, 1, -1):
            if segs[i].name.endswith(":user"):
                segs[i] = Segment("user", segs[i].start, segs[i].end, segs[i].digest)
                break
        n = len(self.ids)
        segs.append(Segment("assistant", n, n + len(self._header), digest(self._header)))
        return self.ids + self._header, segs
