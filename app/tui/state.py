"""The console's model: what the panels show, built from the agent's typed events.

`ConsoleState.apply(event)` is the one place that reads events (a `match` over the event
classes of app.events); widgets only render from the state. Owned and mutated by the UI
thread alone (workers post events as messages; the screen applies them). Keeping it apart
from the widgets lets the screen recompose (80×24 tabs ↔ wide panels) without losing anything,
and lets a recorded session be viewed without an engine.

No Textual here: the state is tested on its own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from app import events as E

# ---- event classes that may not exist yet (the contract is landing) --------------------------


class _Absent:  # a class no event is an instance of: a pattern over it never matches
    pass


CacheEvent = getattr(E, "CacheEvent", _Absent)
KVSnapshot = getattr(E, "KVSnapshot", _Absent)
SessionStarted = getattr(E, "SessionStarted", _Absent)
TelemetrySample = getattr(E, "TelemetrySample", _Absent)


# ---- typed rows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallRow:
    """One engine call's ledger, as the chart and the stats panel show it.

    cached + computed == prompt; computed splits into `fresh` (new tokens that had to be
    computed) and `waste` (recomputed although the session sent them before)."""

    turn: int
    call: int
    kind: str  # "prewarm" | "generate" | "trim" (CallStats.kind)
    prompt: int
    cached: int
    computed: int
    new: int
    waste: int
    reuse: float
    ttft_s: float
    prefill_s: float
    decode_s: float
    decode_tokens: int
    decode_tok_s: float
    finish: str
    weight_format: str
    kv_format: str
    backend: str
    threads: int
    evicted_pages: int
    tool_choice: str
    energy_j: float | None = None  # from the call's telemetry summary, when a power source works

    @property
    def fresh(self) -> int:
        return self.computed - self.waste

    @property
    def prefill_tok_s(self) -> float:
        return self.computed / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def label(self) -> str:
        return "pre" if self.kind == "prewarm" else f"{self.turn}.{self.call}"

    @classmethod
    def from_stats(cls, turn: int, call: int, st, tool_choice: str = "", telemetry: dict | None = None) -> CallRow:
        kind = getattr(st, "kind", "generate")
        energy = (telemetry or {}).get("energy_j")
        return cls(turn, call, kind, st.prompt_tokens, st.cached_tokens, st.computed_tokens, st.new_tokens,
                   st.waste_tokens, st.reuse, st.ttft_s, st.prefill_s, st.decode_s, st.decode_tokens,
                   st.decode_tok_s, st.finish_reason, st.weight_format, st.kv_format, st.backend,
                   int(getattr(st, "threads", 0) or 0), st.evicted_pages, tool_choice,
                   None if energy is None else float(energy))


@dataclass(frozen=True)
class Eviction:
    t_wall: float
    pages: int
    tokens: int
    head_text: str
    owner: int
    reason: str
    at: int = 0  # prefix_tokens: where the evicted span starts in its sequence


@dataclass
class ToolEntry:
    """A tool call in the transcript; `ok` is None until it returned."""

    call_id: str
    name: str
    arguments: object
    raw: str
    ok: bool | None = None
    result: str = ""
    elapsed_s: float = 0.0


@dataclass
class Entry:
    """One transcript item. kind: user | answer | tool | notice | error."""

    kind: str
    turn: int
    text: str = ""
    call: int = 0
    tool: ToolEntry | None = None
    done: bool = False


@dataclass(frozen=True)
class Banner:
    """A prefix break: which segment, from which token, and the diff."""

    turn: int
    call: int
    cause: str
    segment: str
    index: int
    promised: int
    cached: int
    before: str
    old: str
    new: str


# ---- the state -------------------------------------------------------------------------------


@dataclass
class ConsoleState:
    decode: Callable[[list[int]], str] | None = None  # token ids → text (the engine's tokenizer)
    entries: list[Entry] = field(default_factory=list)
    calls: list[CallRow] = field(default_factory=list)
    evictions: deque = field(default_factory=lambda: deque(maxlen=200))
    pool: dict = field(default_factory=dict)
    tree: list = field(default_factory=list)  # the last engine.tree() copy (the cache inspector's)
    pool_history: deque = field(default_factory=lambda: deque(maxlen=120))  # used pages
    banner: Banner | None = None
    lint: tuple[str, ...] = ()
    busy: bool = False
    turn: int = 0
    call_prompt: int = 0  # the prompt tokens of the call running now (0: none)
    dropped_events: int = 0
    model: str = ""
    version: int = 0  # bumped on every change: widgets re-render when it moved

    # ---- totals --------------------------------------------------------------------------
    def totals(self) -> dict:
        calls = self.calls
        prompt = sum(c.prompt for c in calls)
        cached = sum(c.cached for c in calls)
        dec_t = sum(c.decode_tokens for c in calls)
        dec_s = sum(c.decode_s for c in calls)
        comp = sum(c.computed for c in calls)
        pre_s = sum(c.prefill_s for c in calls)
        gen = [c for c in calls if c.kind == "generate"]  # a time to first token is a reply's
        return {
            "calls": len(calls), "prompt": prompt, "cached": cached, "computed": comp,
            "new": sum(c.new for c in calls), "waste": sum(c.waste for c in calls),
            "reuse": cached / prompt if prompt else 0.0,
            "ttft_s": sum(c.ttft_s for c in gen) / len(gen) if gen else 0.0,
            "prefill_tok_s": comp / pre_s if pre_s > 0 else 0.0,
            "decode_tok_s": dec_t / dec_s if dec_s > 0 else 0.0,
            "decode_tokens": dec_t, "evicted_pages": sum(c.evicted_pages for c in calls),
        }

    def turn_energy_j(self, turn: int) -> float | None:
        """Joules of a turn's engine calls (None when no call of it was measured)."""
        js = [c.energy_j for c in self.calls if c.turn == turn and c.energy_j is not None]
        return sum(js) if js else None

    # ---- streaming -----------------------------------------------------------------------
    def stream(self, turn: int, call: int, text: str) -> None:
        """Append coalesced token text to the answer being written."""
        last = self.entries[-1] if self.entries else None
        if last is None or last.kind != "answer" or last.done or last.call != call:
            last = Entry("answer", turn, call=call)
            self.entries.append(last)
        last.text += text
        self.version += 1

    def note(self, kind: str, text: str, turn: int | None = None) -> None:
        self.entries.append(Entry(kind, self.turn if turn is None else turn, text, done=True))
        self.version += 1

    def set_pool(self, snap: dict) -> None:
        if dict(snap) != self.pool:  # the KVSnapshot event and the worker's sample are the same reading
            self.pool_history.append(int(snap.get("used_pages", 0)))
        self.pool = dict(snap)
        self.version += 1

    def _head(self, ev) -> str:
        text = getattr(ev, "head_text", "") if not isinstance(ev, dict) else ""
        if text:
            return text
        head = ev.get("head") if isinstance(ev, dict) else getattr(ev, "head", None)
        if head and self.decode is not None:
            return self.decode(list(head))
        return ""

    def cache_event(self, ev) -> None:
        """A cache event: a typed CacheEvent or the engine's dict (kind, session, pages, head…)."""
        get = ev.get if isinstance(ev, dict) else (lambda k, d=None: getattr(ev, k, d))
        if get("kind") != "evict":
            return
        owner = get("session") if isinstance(ev, dict) else get("engine_session", 0)
        self.evictions.appendleft(Eviction(get("t_wall", None) or time.time(), int(get("pages", 0)),
                                           int(get("tokens", 0)), " ".join(self._head(ev).split()[:8]),
                                           int(owner or 0), str(get("reason", "")), int(get("prefix_tokens", 0) or 0)))
        self.version += 1

    # ---- events --------------------------------------------------------------------------
    def apply(self, ev) -> None:
        """Fold one agent event into the state."""
        match ev:
            case E.TurnStarted(turn=turn, user_text=text):
                self.turn = turn
                self.busy = True
                self.banner = None
                self.entries.append(Entry("user", turn, text, done=True))
            case E.PromptLinted(issues=issues):
                self.lint = tuple(issues)
                for issue in issues:
                    self.note("notice", f"prompt lint: {issue}")
            case E.EngineCallStarted(prompt_tokens=n):
                self.call_prompt = n
            case E.TokenDelta(turn=turn, call=call, text=text):
                self.stream(turn, call, text)
            case E.EngineCallFinished(turn=turn, call=call, stats=st, tool_choice=choice):
                self.call_prompt = 0
                self.calls.append(CallRow.from_stats(turn, call, st, choice, getattr(ev, "telemetry", None)))
                for e in self.entries:
                    if e.kind == "answer" and e.call == call and e.turn == turn:
                        e.done = True
                if st.finish_reason in ("cancelled", "pool_full") and st.kind != "trim":
                    self.note("error", f"call {turn}.{call} ended: {st.finish_reason}")
                dropped = getattr(ev, "trimmed_tokens", 0)
                if dropped and st.kind == "trim":  # made after the turn, while the user reads and types
                    self.note("notice", f"context trimmed ahead of the next turn (call {turn}.{call}, "
                              f"{st.prefill_s:.1f} s of idle time): {dropped} oldest history tokens dropped, "
                              f"{getattr(ev, 'trim_recomputed_tokens', 0)} kept tokens computed into the cache"
                              + (" (cut short: the next call computes the rest)" if st.finish_reason == "cancelled"
                                 else ""), turn)
                elif dropped:  # a context trim: expected work, not a cache killer (no banner)
                    self.note("notice", f"context trimmed at call {turn}.{call}: {dropped} oldest history tokens "
                              f"dropped, {getattr(ev, 'trim_recomputed_tokens', 0)} kept tokens recomputed; "
                              f"{getattr(ev, 'context_used', 0)} of a {getattr(ev, 'context_budget', 0)}-token "
                              "budget used", turn)
            case E.PrefixBreak(cause="trimmed"):
                pass  # reported by the EngineCallFinished note above
            case E.PrefixBreak():
                self.banner = Banner(ev.turn, ev.call, ev.cause, ev.segment, ev.index, ev.promised_tokens,
                                     ev.cached_tokens, ev.before, ev.old, ev.new)
            case E.ToolCalled(turn=turn, call_id=cid, name=name, arguments=args, raw=raw):
                last = self.entries[-1] if self.entries else None
                if last is not None and last.kind == "answer" and last.turn == turn:  # the call's raw text
                    keep = last.text[: last.text.index(raw)].strip() if raw and raw in last.text else ""
                    if keep:
                        last.text = keep
                    else:
                        self.entries.pop()
                self.entries.append(Entry("tool", turn, tool=ToolEntry(cid, name, args, raw)))
            case E.ToolReturned(call_id=cid, ok=ok, content=content, elapsed_s=el):
                for e in reversed(self.entries):
                    if e.tool is not None and e.tool.call_id == cid:
                        e.tool.ok, e.tool.result, e.tool.elapsed_s = ok, content, el
                        e.done = True
                        break
            case E.TurnFinished(turn=turn, answer=answer):
                self.busy = False
                if not any(e.kind == "answer" and e.turn == turn and e.text.strip() for e in self.entries[-1:]):
                    self.entries.append(Entry("answer", turn, answer, done=True))
            case E.TurnFailed(turn=turn, error=error):
                self.busy = False
                self.call_prompt = 0
                self.note("error", f"turn {turn} failed: {error}", turn)
            case CacheEvent():
                self.cache_event(ev)
            case KVSnapshot():
                self.set_pool({k: getattr(ev, k) for k in ("total_pages", "used_pages", "free_pages",
                               "pinned_pages", "evictable_pages", "locked_pages", "cached_pages",
                               "tree_nodes", "block", "bytes_per_token")})
            case SessionStarted():
                self.model = getattr(getattr(ev, "run", None), "model", "") or self.model
            case _:
                return
        self.version += 1
