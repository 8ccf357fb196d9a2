"""Headless events: facts the agent loop yields, in past tense. Store and UI consume them.

The contract is /work/notes/EVENTS_SPEC.md. Every event carries the store's short session id
(set by the Agent, which is given it), a monotonic and a wall-clock time of its creation.
Frozen dataclasses only; nothing here imports the store, the UI or textual.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.config import RunConfig
    from app.engine.types import CallStats


@dataclass(frozen=True, kw_only=True)
class Event:
    session_id: str = ""
    t_mono: float = field(default_factory=time.monotonic)
    t_wall: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        d = {"event": type(self).__name__}
        for k, v in self.__dict__.items():
            d[k] = v.as_dict() if hasattr(v, "as_dict") else v
        return d


# ---- session ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionStarted(Event):
    """The first event of a session: how it was configured (what a replay changes)."""

    run: RunConfig
    title: str = ""
    parent_id: str = ""  # the source session of a replay ("" otherwise)


@dataclass(frozen=True)
class MessageAdded(Event):
    """A message appended to the conversation's token ids, spanning ids[start:end].

    turn 0 holds the static prefix (roles "system" and "tools"). `ids` are the message's exact
    token ids (an assistant reply as generated), so a stored conversation can be rebuilt.
    """

    turn: int
    role: str  # system | tools | user | assistant | tool
    content: str
    start: int
    end: int
    ids: tuple[int, ...] = ()


# ---- turns --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TurnStarted(Event):
    turn: int
    user_text: str
    tool_choice: str
    now: str = ""  # the time the user message carries (ISO 8601); a replay feeds it back


@dataclass(frozen=True)
class PromptLinted(Event):
    """Static checks of the prompt (timestamps, UUIDs, unsorted tools, non-canonical JSON)."""

    issues: tuple[str, ...]


@dataclass(frozen=True)
class TurnFinished(Event):
    turn: int
    answer: str
    steps: int
    engine_calls: int
    tool_calls: int


@dataclass(frozen=True)
class TurnFailed(Event):
    """The turn ended without an answer; the conversation is rolled back to before the turn."""

    turn: int
    error: str
    details: dict = field(default_factory=dict)


# ---- engine calls -------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineCallStarted(Event):
    turn: int
    call: int
    prompt_tokens: int
    tool_choice: str


@dataclass(frozen=True)
class TokenDelta(Event):
    turn: int
    call: int
    text: str


@dataclass(frozen=True)
class EngineCallFinished(Event):
    """One engine call's ledger (CallStats) plus the detector's token-level figures.

    stats.kind is "prewarm" for the pre-warm of the static prefix (turn 0, call 0).
    """

    turn: int
    call: int
    stats: CallStats
    reusable_tokens: int  # page-floored common prefix with the previous call's prompt + output
    output_tokens: int
    tool_choice: str
    telemetry: dict | None = None  # per-call telemetry summary (app.telemetry), when a source works
    # The context budget (app/agent/budget.py): tokens this session's call may use (prompt + reply),
    # what it used, and — for a call whose prompt was trimmed — the ids dropped and the ids of the
    # kept history recomputed because of the trim. trimmed_tokens > 0 marks a trim call.
    context_budget: int = 0
    context_used: int = 0
    trimmed_tokens: int = 0
    trim_recomputed_tokens: int = 0

    def as_dict(self) -> dict:
        d = {"event": "EngineCallFinished", "session_id": self.session_id, "t_mono": self.t_mono,
             "t_wall": self.t_wall, "turn": self.turn, "call": self.call, "tool_choice": self.tool_choice,
             "reusable_tokens": self.reusable_tokens, "output_tokens": self.output_tokens,
             "telemetry": self.telemetry, "context_budget": self.context_budget, "context_used": self.context_used,
             "trimmed_tokens": self.trimmed_tokens, "trim_recomputed_tokens": self.trim_recomputed_tokens}
        return d | self.stats.as_dict()


@dataclass(frozen=True)
class PrefixBreak(Event):
    """This call could not reuse what the previous call promised (prompt + output, page-floored)."""

    turn: int
    call: int
    cause: str  # "prompt changed" | "cache shortfall" | "trimmed" (the context budget dropped old turns)
    index: int  # first divergent token (or first uncached token for a shortfall)
    segment: str  # system | tools | history[i]:role | user | assistant
    promised_tokens: int
    cached_tokens: int
    before: str  # the text just before the divergence
    old: str  # what the previous call had from there
    new: str  # what this call has from there
    changed_segments: tuple[str, ...] = ()


@dataclass(frozen=True)
class CacheEvent(Event):
    """One prefix-cache event of an engine call (the engine's event dicts, typed)."""

    turn: int
    call: int
    kind: str  # hit | insert | evict | pin | unpin
    engine_session: int  # the engine's session id that owns it (0: anonymous)
    pages: int
    tokens: int
    prefix_tokens: int
    head_text: str  # the first tokens, decoded
    reason: str


@dataclass(frozen=True)
class KVSnapshot(Event):
    """The KV pool after an engine call (engine.snapshot())."""

    turn: int
    call: int
    total_pages: int
    used_pages: int
    free_pages: int
    pinned_pages: int
    evictable_pages: int
    locked_pages: int
    cached_pages: int
    tree_nodes: int
    block: int
    bytes_per_token: float


# ---- tools --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCalled(Event):
    turn: int
    call_id: str
    name: str
    arguments: Any
    raw: str


@dataclass(frozen=True)
class ToolReturned(Event):
    turn: int
    call_id: str
    name: str
    ok: bool
    content: str
    elapsed_s: float
    outcome: str = ""  # ok | error | timeout-killed | timeout-abandoned | replayed | replay-missing


# ---- telemetry ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TelemetrySample(Event):
    """One telemetry reading: app.telemetry.Sample.values() (temps_c, rails_w, power_w, power_scope,
    clocks_mhz, caps_mhz, load_pct, mem_mb, power_mode, throttle, notes); app.telemetry.to_event()
    builds it. source: the reader ("jetson-sysfs", "nvml", "psutil", "recorded:...")."""

    source: str
    values: dict


def to_dict(event: Event) -> dict:
    return event.as_dict()


__all__ = [
    "CacheEvent", "EngineCallFinished", "EngineCallStarted", "Event", "KVSnapshot", "MessageAdded", "PrefixBreak",
    "PromptLinted", "SessionStarted", "TelemetrySample", "TokenDelta", "ToolCalled", "ToolReturned", "TurnFailed",
    "TurnFinished", "TurnStarted", "asdict", "to_dict",
]
