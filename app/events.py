"""Headless events: facts the agent loop yields, in past tense. Store and UI consume them.

Frozen dataclasses only; nothing here imports the store, the UI or textual.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.engine.types import CallStats


@dataclass(frozen=True)
class Event:
    def as_dict(self) -> dict:
        d = {"event": type(self).__name__}
        for k, v in self.__dict__.items():
            d[k] = v.as_dict() if hasattr(v, "as_dict") else v
        return d


@dataclass(frozen=True)
class TurnStarted(Event):
    turn: int
    user_text: str
    tool_choice: str


@dataclass(frozen=True)
class PromptLinted(Event):
    """Static checks of the prompt (timestamps, UUIDs, unsorted tools, non-canonical JSON)."""

    issues: tuple[str, ...]


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
    """One engine call's ledger (CallStats) plus the detector's token-level figures."""

    turn: int
    call: int
    stats: CallStats
    reusable_tokens: int  # page-floored common prefix with the previous call's prompt + output
    output_tokens: int
    tool_choice: str

    def as_dict(self) -> dict:
        d = {"event": "EngineCallFinished", "turn": self.turn, "call": self.call, "tool_choice": self.tool_choice,
             "reusable_tokens": self.reusable_tokens, "output_tokens": self.output_tokens}
        return d | self.stats.as_dict()


@dataclass(frozen=True)
class PrefixBreak(Event):
    """This call could not reuse what the previous call promised (prompt + output, page-floored)."""

    turn: int
    call: int
    cause: str  # "prompt changed" | "cache shortfall"
    index: int  # first divergent token (or first uncached token for a shortfall)
    segment: str  # system | tools | history[i]:role | user | assistant
    promised_tokens: int
    cached_tokens: int
    before: str  # the text just before the divergence
    old: str  # what the previous call had from there
    new: str  # what this call has from there
    changed_segments: tuple[str, ...] = ()


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


@dataclass(frozen=True)
class TurnFinished(Event):
    turn: int
    answer: str
    steps: int
    engine_calls: int
    tool_calls: int


@dataclass(frozen=True)
class TurnFailed(Event):
    turn: int
    error: str
    details: dict = field(default_factory=dict)


def to_dict(event: Event) -> dict:
    return event.as_dict()


__all__ = [
    "EngineCallFinished", "EngineCallStarted", "Event", "PrefixBreak", "PromptLinted", "TokenDelta",
    "ToolCalled", "ToolReturned", "TurnFailed", "TurnFinished", "TurnStarted", "asdict", "to_dict",
]
