"""The canonical prompt, kept as token ids and only ever appended to (or trimmed by whole turns).

    [system: static text] [tools: schemas sorted by name, compact JSON, sorted keys]
    [history: user / assistant / tool messages, each encoded once] [new user message + dynamic data]
    [assistant header: the generation point]

Each piece is tokenised once, on its own (ChatFormat.message_ids / assistant_prefix), and the
ids are concatenated: the history is never re-rendered nor re-tokenised. An assistant reply
enters the history as the exact ids the model generated, so the next request extends the
previous request + its output token for token (what a prefix cache can reuse).

A turn is one user message and everything after it up to the next user message (the replies,
tool calls and tool results). `trim(n)` drops the n oldest whole turns: the ids become the
static prefix + the kept messages' ids exactly as they were (no re-tokenisation), so the
static prefix (pinned, cached) is still served from the cache and only the kept history is
recomputed once.

Contracts
- `CanonicalPrompt` owns `ids` and `segments`; add_* methods mutate by appending only.
  `trim` (the context budget, app/agent/budget.py), `restore` (a failed turn is undone) and
  `replace_system` (the broken demo: a timestamp in the system prompt) are the exceptions.
- `request()` does not mutate: it returns ids + the assistant header.
- Segment names `history[i]:role` number messages in the order they were added and keep their
  number across a trim, so a name always means the same message.
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


# ---- typed values -----------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    name: str  # system | tools | history[i]:role | user
    start: int
    end: int
    digest: str  # blake2b of the ids, 16 hex chars
    turn: int = 0  # the turn a history message belongs to (0: the static prefix)

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class TurnSpan:
    """One turn of the history: its number (as add_user was given it), token span and message count."""

    turn: int
    start: int
    end: int
    messages: int

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Trim:
    """What one trim did: the whole turns dropped, oldest first, and the prompt before and after."""

    turns: tuple[int, ...]  # turn numbers dropped
    messages: int  # messages dropped
    tokens: int  # ids dropped
    before: int  # prompt ids before the trim (without the assistant header)
    after: int  # ... and after
    static: int  # the static prefix (system + tools), kept
    segments: tuple[str, ...] = ()  # the dropped messages' segment names (history[i]:role)

    def describe(self) -> str:
        span = f"{self.turns[0]}" if len(self.turns) == 1 else f"{self.turns[0]}–{self.turns[-1]}"
        return (f"context trimmed: dropped turn{'s' if len(self.turns) > 1 else ''} {span} "
                f"({self.messages} messages, {self.tokens} tokens); prompt {self.before} → {self.after} tokens, "
                f"system prompt and tools ({self.static} tokens) kept")


@dataclass(frozen=True)
class PromptState:
    """A copy of a CanonicalPrompt's state (checkpoint / restore): what a failed turn returns to."""

    ids: tuple[int, ...]
    segments: tuple[Segment, ...]
    roles: tuple[str, ...]
    system_prompt: str


def digest(ids: list[int]) -> str:
    return hashlib.blake2b(orjson.dumps(ids), digest_size=8).hexdigest()


# ---- the prompt -----------------------------------------------------------------------------
class CanonicalPrompt:
    """One conversation's prompt as token ids; owned by one agent; appended to, never re-rendered."""

    def __init__(self, chat: ChatFormat, calls: CallFormat, schemas: list[dict], system_prompt: str = SYSTEM_PROMPT):
        self.chat = chat
        self.calls = calls
        self.system_prompt = system_prompt
        self.tools_text = tools_block(schemas, calls)
        self.ids: list[int] = []
        # The whole state is ids, segments, _roles and system_prompt (a caller may copy and restore
        # exactly these): a message's turn is on its Segment, the next history[i] follows the last.
        self.segments: list[Segment] = []
        self._roles: list[str] = []  # per history segment (segments[2:]): user | assistant | tool
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

    def _append(self, role: str, ids: list[int], turn: int | None = None) -> None:
        """Append one message's ids. `turn` defaults to a new turn for a user message, else the current one."""
        if turn is None:
            turn = self._current_turn() + (role == "user")
        start = len(self.ids)
        self.ids += ids
        self.segments.append(Segment(f"history[{self._next_index()}]:{role}", start, len(self.ids), digest(ids), turn))
        self._roles.append(role)

    def _current_turn(self) -> int:
        return self.segments[-1].turn if len(self.segments) > 2 else 0

    def _next_index(self) -> int:
        if len(self.segments) <= 2:
            return 0
        name = self.segments[-1].name  # history[i]:role
        return int(name[name.index("[") + 1: name.index("]")]) + 1

    def add_user(self, text: str, now: datetime | None = None, turn: int | None = None) -> None:
        """The new user message, which starts a turn; all dynamic data (time, ids) goes here."""
        tags = []
        if now is not None:
            tags.append(f"time {now.isoformat(timespec='seconds')}")
        if turn is not None:
            tags.append(f"turn {turn}")
        content = (f"[{' · '.join(tags)}]\n" if tags else "") + text
        self._append("user", self.chat.message_ids(Message("user", content)),
                     turn if turn is not None else self._current_turn() + 1)

    def add_assistant(self, output_ids: list[int]) -> None:
        """The reply exactly as generated: header + output ids + the format's closing ids."""
        self._append("assistant", self._header + list(output_ids) + self._closing, self._current_turn())

    def add_tool_result(self, content: str) -> None:
        c = self.calls
        msg = Message(c.result_role, f"{c.result_prefix}{content}{c.result_suffix}")
        self._append("tool", self.chat.message_ids(msg), self._current_turn())

    def replace_system(self, system_prompt: str) -> None:
        """Re-render the system segment (what a naive agent does with a timestamp). Breaks the prefix."""
        tail = self.ids[self.static_tokens:]
        old = self.segments[2:]
        self._put_system(system_prompt)
        shift = len(self.ids) - old[0].start if old else 0
        self.ids += tail
        self.segments += [Segment(s.name, s.start + shift, s.end + shift, s.digest, s.turn) for s in old]
        self.system_prompt = system_prompt

    # ---- the context budget: trim, checkpoint, restore ---------------------------------------
    def turns(self) -> list[TurnSpan]:
        """The history's turns, oldest first; the last one is the turn in progress (if any)."""
        out: list[TurnSpan] = []
        for seg in self.segments[2:]:
            turn = seg.turn
            if out and out[-1].turn == turn:
                last = out[-1]
                out[-1] = TurnSpan(turn, last.start, seg.end, last.messages + 1)
            else:
                out.append(TurnSpan(turn, seg.start, seg.end, 1))
        return out

    def trim(self, n_turns: int) -> Trim:
        """Drop the `n_turns` oldest whole turns; never the static prefix, never the last turn.

        The kept messages keep their ids exactly (copied, not re-tokenised) and their names.
        """
        spans = self.turns()
        if not 1 <= n_turns < len(spans):
            raise ValueError(f"trim: can drop 1..{len(spans) - 1} whole turns of {len(spans)} "
                             f"(the turn in progress stays), asked for {n_turns}")
        static = self.static_tokens
        cut = spans[n_turns].start  # first kept token
        n_msgs = sum(s.messages for s in spans[:n_turns])
        before = len(self.ids)
        gone = tuple(s.name for s in self.segments[2: 2 + n_msgs])
        self.ids = self.ids[:static] + self.ids[cut:]
        shift = cut - static
        kept = self.segments[2 + n_msgs:]
        self.segments = self.segments[:2] + [Segment(s.name, s.start - shift, s.end - shift, s.digest, s.turn)
                                             for s in kept]
        self._roles = self._roles[n_msgs:]
        return Trim(tuple(s.turn for s in spans[:n_turns]), n_msgs, shift, before, len(self.ids), static, gone)

    def checkpoint(self) -> PromptState:
        return PromptState(tuple(self.ids), tuple(self.segments), tuple(self._roles), self.system_prompt)

    def restore(self, state: PromptState) -> None:
        """Return to a checkpoint (a failed turn leaves the conversation as it was)."""
        self.ids = list(state.ids)
        self.segments = list(state.segments)
        self._roles = list(state.roles)
        self.system_prompt = state.system_prompt

    # ---- reading --------------------------------------------------------------------------
    @property
    def static_tokens(self) -> int:
        """The system prompt + tool schemas: the prefix that is pre-warmed, pinned, never trimmed."""
        return self.segments[1].end

    @property
    def header_tokens(self) -> int:
        return len(self._header)

    def request(self) -> tuple[list[int], list[Segment]]:
        """The ids of the next engine call (history + assistant header) and their segments.

        The latest user message is named "user"; the header is the "assistant" segment.
        """
        segs = list(self.segments)
        for i in range(len(segs) - 1, 1, -1):
            if segs[i].name.endswith(":user"):
                segs[i] = Segment("user", segs[i].start, segs[i].end, segs[i].digest, segs[i].turn)
                break
        n = len(self.ids)
        segs.append(Segment("assistant", n, n + len(self._header), digest(self._header)))
        return self.ids + self._header, segs
