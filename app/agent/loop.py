"""The agent loop: one conversation on one engine Session, a generator of typed events.

    agent = Agent(engine, Toolkit(fns), session_id="3f9c2a")
    for event in agent.prewarm(): ...            # the static prefix as an engine call of its own
    for event in agent.run_turn("How hot is the board?", tool_choice="auto"):
        match event: ...
    for event in agent.trim_ahead(): ...         # idle time: a trim the next turn would need, made now

Per user turn, at most `max_steps` engine calls: each call sends the whole canonical prompt
(token ids, appended to, never re-rendered); a reply that is a tool call is executed through the
executor (errors go back to the model as tool results) and the loop calls the engine again; a
plain reply ends the turn. A forced tool_choice (required / a tool's name) applies to the first
call of the turn, then `follow_up`; the last allowed step is "none", so every turn ends in an answer.
A failed or cancelled turn ends in TurnFailed and the conversation is rolled back to before it.

Imports: app.engine, app.events and app.config's typed values only (never the store, the UI or textual).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from datetime import datetime

from app.agent.budget import BudgetPolicy, ContextKeeper, ContextOverflow
from app.agent.cachecheck import PrefixDetector, lint_prompt, segment_at
from app.agent.constrain import (GrammarConstraint, RepetitionGuard, TriggeredConstraint, call_grammar, ll_tokenizer,
                                 no_opener_mask)
from app.agent.executor import Executed, ThreadExecutor, ToolExecutor
from app.agent.parse import CallParseError, parse_call, split_call, call_format_for
from app.agent.prompt import SYSTEM_PROMPT, CanonicalPrompt
from app.agent.toolkit import Toolkit
from app.config import RunConfig
from app.engine import CancelFlag, Engine, EngineError, KvPoolFull, SamplingParams
from app.engine.chat_format import chat_format_for
from app.events import (
    CacheEvent,
    EngineCallFinished,
    EngineCallStarted,
    Event,
    KVSnapshot,
    MessageAdded,
    PrefixBreak,
    PromptLinted,
    SessionStarted,
    TokenDelta,
    ToolCalled,
    ToolReturned,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)


@dataclass(frozen=True)
class AgentLimits:
    max_steps: int = 4  # engine calls per user turn
    max_tokens: int = 200  # tokens per free reply
    call_max_tokens: int = 160  # tokens per constrained tool call
    follow_up: str = "auto"  # tool_choice after a tool result ("none": answer from it; small models loop on auto)


class Agent:
    """A conversation with tools. Owns its Session, CanonicalPrompt and PrefixDetector; one caller at a time
    (except `cancel`, which any thread may call).

    `session_id` is stamped on every event (the store's id). `executor` runs tool calls (default: a
    ThreadExecutor over the toolkit; a replay passes recorded results). `system_timestamp=True`
    reproduces the classic cache killer (the system prompt re-rendered with the current time before
    every call); it exists to demonstrate the detector and the gate.
    """

    def __init__(
        self,
        engine: Engine,
        toolkit: Toolkit,
        *,
        system_prompt: str = SYSTEM_PROMPT,
        limits: AgentLimits = AgentLimits(),
        sampling: SamplingParams = SamplingParams(),
        name: str = "agent",
        clock: Callable[[], datetime] | None = None,
        system_timestamp: bool = False,
        session_id: str = "",
        executor: ToolExecutor | None = None,
        budget: BudgetPolicy = BudgetPolicy(),
    ):
        cfg = engine.config
        self.engine = engine
        self.toolkit = toolkit
        self.limits = limits
        self.sampling = sampling
        self.session_id = session_id
        self.executor = executor or ThreadExecutor(toolkit)
        self.session = engine.session(name)
        self.clock = clock or (lambda: datetime.now().astimezone())
        self.chat = chat_format_for(cfg.chat_format, engine.tokenizer)
        self.calls = call_format_for(cfg.chat_format, cfg.chat_template)
        self.base_system = system_prompt
        self.system_timestamp = system_timestamp
        self.prompt = CanonicalPrompt(self.chat, self.calls, toolkit.schemas, self._system_text())
        self.detector = PrefixDetector(self._decode)
        self.context = ContextKeeper(engine, budget)  # the context budget: trims whole old turns (budget.py)
        self.turn = 0
        self.call_index = 0
        self.prewarmed = False
        self._static_sent = False
        self._cancel = threading.Event()
        self._gen = None
        self._ahead_flag = None  # the CancelFlag of a trim-ahead computation in flight
        self._llt = None
        self._no_opener = None
        self._grammars: dict[str, str] = {}

    # ---- the session ----------------------------------------------------------------------
    def _ev(self, cls, *args, **kw):
        return cls(*args, session_id=self.session_id, **kw)

    def run_config(self, workspace: str = "", model: str | None = None, model_sha256: str = "") -> RunConfig:
        """The RunConfig of this agent and its engine (what SessionStarted records)."""
        eng, lim, sp = self.engine, self.limits, self.sampling
        snap = eng.snapshot()
        return RunConfig(
            model=model or eng.config.model, model_sha256=model_sha256, weight_format=eng.weight_format,
            activations=getattr(eng, "activations", "auto"), kv_format=eng.kv_format, backend=eng.backend,
            threads=int(getattr(eng, "threads", 0) or 0),
            kv_pages=int(snap.get("total_pages", 0)), kv_block=int(snap.get("block", 16)),
            prefix_cache=bool(eng.prefix_cache), prewarm=self.prewarmed, temperature=sp.temperature,
            top_k=sp.top_k, top_p=sp.top_p, seed=sp.seed, max_steps=lim.max_steps, max_tokens=lim.max_tokens,
            call_max_tokens=lim.call_max_tokens, follow_up=lim.follow_up, tools=tuple(self.toolkit.names),
            workspace=workspace)

    def session_started(self, run: RunConfig, title: str = "", parent_id: str = "") -> SessionStarted:
        return self._ev(SessionStarted, run, title, parent_id)

    def _static_messages(self) -> list[Event]:
        """MessageAdded for system and tools (turn 0), once per conversation."""
        if self._static_sent:
            return []
        self._static_sent = True
        out = []
        for seg, role, text in ((self.prompt.segments[0], "system", self.prompt.system_prompt),
                                (self.prompt.segments[1], "tools", self.prompt.tools_text)):
            out.append(self._ev(MessageAdded, 0, role, text, seg.start, seg.end, tuple(self.prompt.ids[seg.start:seg.end])))
        return out

    def prewarm(self) -> list[Event]:
        """Compute, cache and pin the static prefix (system prompt + tool schemas) before the first
        turn, so even the first call only computes its own message (seed 000 §6). The pin lasts as
        long as the session. Returns the events of that engine call (turn 0, call 0, stats.kind
        "prewarm"): CacheEvents, EngineCallFinished, KVSnapshot (after the static MessageAdded)."""
        out = self._static_messages()
        static = self.prompt.ids[: self.prompt.segments[1].end]
        res = self.session.prewarm(static)
        self.prewarmed = True
        self.context.pinned_tokens = int(getattr(res, "pinned_tokens", res if isinstance(res, int) else 0))
        stats = getattr(res, "stats", None)
        if stats is None:  # an engine without the Prewarm ledger: nothing to report
            return out
        out += self._cache_events(0, 0, getattr(res, "events", []))
        out.append(self._ev(EngineCallFinished, 0, 0, stats, 0, 0, "prewarm"))
        out.append(self._snapshot(0, 0))
        self.detector.record(static, self.prompt.segments[:2], [], "stop")
        return out

    def trim_ahead(self) -> Iterator[Event]:
        """After a turn ended, in idle time: when the next turn is expected not to fit the context
        budget (ContextKeeper.ahead), trim the oldest whole turns now and compute the kept history
        into the prefix cache — an engine call of its own (the last turn's number, stats.kind
        "trim", no generated token) — so the next call serves it from the cache. Yields nothing
        when no trim is due, the prefix cache is off or the policy's `ahead` is off. cancel()
        stops the computation between layers: the pages done stay cached, the next call computes
        the rest and counts it as the trim's recomputation. Never raises for an engine error: the
        trim stands and the next call computes what is missing."""
        if not self.context.policy.ahead or not self.engine.prefix_cache or self.turn == 0:
            return
        ahead = self.context.ahead(self.prompt, self.limits.max_tokens)  # a free reply's reserve (auto / none)
        if ahead is None:
            return
        ids, segs = list(self.prompt.ids), list(self.prompt.segments)
        check = self.detector.check(ids, segs)
        if check.broken:  # the kept history moved: a trim (segment "history"), as in prepare()
            check = replace(check, segment="history", changed_segments=ahead.trim.segments)
        turn = self.turn
        self.call_index += 1
        call = self.call_index
        self._ahead_flag = flag = CancelFlag()  # cancel() sets it from here on (and _cancel before)
        try:
            if self._cancel.is_set():  # cancelled before the flag existed (run_turn clears it)
                flag.set()
            yield self._ev(EngineCallStarted, turn, call, len(ids), "none")
            res = self.session.precompute(ids, "trim", cancel=flag)
        except (EngineError, ValueError):  # e.g. the pool is full: the next call computes it
            self.detector.record(ids, segs, [], "stop")
            self.detector.prev_cacheable = 0
            self.context.carried = len(ids)
            return
        finally:
            self._ahead_flag = None
        stats = res.stats
        done = stats.cached_tokens + stats.computed_tokens
        self.detector.record(ids, segs, [], "stop")
        self.detector.prev_cacheable = min(self.detector.prev_cacheable, done)
        self.context.carried = len(ids) - done
        yield self._ev(EngineCallFinished, turn, call, stats, check.reusable_tokens, 0, "none",
                       context_budget=ahead.budget.tokens, context_used=len(ids),
                       trimmed_tokens=ahead.trim.tokens, trim_recomputed_tokens=stats.computed_tokens)
        yield from self._cache_events(turn, call, res.events)
        yield self._snapshot(turn, call)
        if check.broken:
            yield self._ev(PrefixBreak, turn, call, "trimmed", check.common_tokens, check.segment,
                           check.promised_tokens, stats.cached_tokens, check.before, check.old, check.new,
                           check.changed_segments)

    def restore(self, messages: list[tuple[int, str, str, tuple[int, ...]]], calls: int = 0, turns: int = 0) -> None:
        """Continue a stored conversation: (turn, role, content, ids) in order, turn 0 = system, tools;
        `calls` / `turns` = the engine calls and turns it recorded, failed ones included (the next
        ones are numbered after them).

        The stored static prefix must equal this agent's (same system prompt and tools), else ValueError.
        """
        static = [m for m in messages if m[0] == 0]
        mine = tuple(self.prompt.ids[: self.prompt.segments[1].end])
        theirs = tuple(i for m in static for i in m[3])
        if static and theirs != mine:
            raise ValueError("the stored session's system prompt or tool set differs from this agent's "
                             "(tools folder or system prompt changed since it was recorded)")
        self._static_sent = True
        self.call_index = max(self.call_index, calls)
        self.turn = max(self.turn, turns)
        for turn, role, _content, ids in messages:
            if turn > 0:
                self.prompt._append(role, list(ids), turn)
                self.turn = max(self.turn, turn)

    def cancel(self) -> None:
        """Stop the running engine call (any thread); the turn ends in TurnFailed('cancelled')."""
        self._cancel.set()
        gen = self._gen
        if gen is not None and hasattr(gen, "cancel"):
            gen.cancel()
        flag = self._ahead_flag
        if flag is not None:
            flag.set()

    def close(self) -> None:
        """Release the session's pins and stop the executor's worker. Idempotent."""
        self.session.close()
        self.executor.close()

    # ---- helpers --------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        return self.engine.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _system_text(self) -> str:
        if not self.system_timestamp:
            return self.base_system
        return f"{self.base_system}\nCurrent time: {self.clock().isoformat(timespec='milliseconds')}"

    def lint(self) -> list[str]:
        return lint_prompt(self.prompt.system_prompt, self.prompt.tools_text, self.toolkit.schemas)

    def _grammar(self, choice: str, opener_seen: bool) -> str:
        key = f"{choice}|{opener_seen}"
        if key not in self._grammars:
            tools = self.toolkit.schemas
            if choice not in ("auto", "required"):
                tools = [s for s in tools if s["name"] == choice]
            self._grammars[key] = call_grammar(tools, self.calls, self.engine.tokenizer, opener_seen)
        return self._grammars[key]

    def constraint(self, choice: str):
        """The TokenConstraint for a tool_choice: the call grammar, or a repetition guard for free text."""
        if choice == "none" or not self.toolkit.tools:
            if self._no_opener is None:
                self._no_opener = no_opener_mask(self.engine.tokenizer, self.engine.config.vocab_size, self.calls.opener)
            return RepetitionGuard(self.engine.tokenizer, first_mask=self._no_opener)
        if choice not in ("auto", "required") and choice not in self.toolkit.tools:
            raise ValueError(f"tool_choice {choice!r}: no such tool (auto, required, none, {', '.join(self.toolkit.names)})")
        cfg = self.engine.config
        if self._llt is None:
            self._llt = ll_tokenizer(self.engine.tokenizer, cfg.vocab_size, list(cfg.stop_token_ids))
        if choice == "auto":
            return RepetitionGuard(self.engine.tokenizer, TriggeredConstraint(
                lambda: GrammarConstraint(self._llt, self._grammar("auto", True), cfg.vocab_size),
                self.calls, self.engine.tokenizer))
        return GrammarConstraint(self._llt, self._grammar(choice, False), cfg.vocab_size)

    def _cache_events(self, turn: int, call: int, events: list[dict]) -> list[Event]:
        return [self._ev(CacheEvent, turn, call, str(e.get("kind", "")), int(e.get("session", 0)),
                         int(e.get("pages", 0)), int(e.get("tokens", 0)), int(e.get("prefix_tokens", 0)),
                         self._decode(list(e.get("head", []))[:16]), str(e.get("reason", "")))
                for e in events]

    def _snapshot(self, turn: int, call: int) -> KVSnapshot:
        snap = self.engine.snapshot()
        names = [f.name for f in fields(KVSnapshot) if f.name not in ("turn", "call") and f.init and not f.kw_only]
        return self._ev(KVSnapshot, turn, call, *(snap.get(n, 0) for n in names))

    def _added(self, turn: int, role: str, content: str) -> MessageAdded:
        seg = self.prompt.segments[-1]
        return self._ev(MessageAdded, turn, role, content, seg.start, seg.end, tuple(self.prompt.ids[seg.start:seg.end]))

    def _mark(self):
        d = self.detector
        return self.prompt.checkpoint(), (list(d.prev_ids), d.prev_cacheable, list(d.prev_segments))

    def _rollback(self, mark) -> None:
        state, (self.detector.prev_ids, self.detector.prev_cacheable, self.detector.prev_segments) = mark
        self.prompt.restore(state)

    def execute(self, reply: str, turn: int, call_id: str) -> Iterator[Event]:
        """Parse and run the tool call in `reply`; append its result to the prompt. Never raises.
        Yields ToolCalled, ToolReturned, MessageAdded(tool)."""
        _, raw = split_call(reply, self.calls)
        raw = raw or reply
        try:
            call = parse_call(raw, self.calls)
        except CallParseError as e:
            yield self._ev(ToolCalled, turn, call_id, "", None, raw)
            result = Executed(False, f"error: {e}", 0.0, "error")
            yield self._ev(ToolReturned, turn, call_id, "", False, result.content, 0.0, result.outcome)
        else:
            yield self._ev(ToolCalled, turn, call_id, call.name, call.arguments, raw)
            result = self.executor(turn, call_id, call.name, call.arguments)
            yield self._ev(ToolReturned, turn, call_id, call.name, result.ok, result.content, result.elapsed_s,
                           result.outcome)
        self.prompt.add_tool_result(result.content)
        yield self._added(turn, "tool", result.content)

    # ---- the turn -------------------------------------------------------------------------
    def run_turn(self, text: str, tool_choice: str = "auto") -> Iterator[Event]:
        """Run one user turn to its answer, yielding events. Errors end the turn, not the session."""
        if tool_choice not in ("auto", "required", "none") and tool_choice not in self.toolkit.tools:
            raise ValueError(f"tool_choice {tool_choice!r}: no such tool (auto, required, none, {', '.join(self.toolkit.names)})")
        self.turn += 1
        turn = self.turn
        self._cancel.clear()
        now = self.clock()
        yield from self._static_messages()
        yield self._ev(TurnStarted, turn, text, tool_choice, now.isoformat(timespec="seconds"))
        if turn == 1:
            issues = self.lint()
            if issues:
                yield self._ev(PromptLinted, tuple(issues))
        mark = self._mark()
        try:
            failed = yield from self._steps(turn, text, tool_choice, now)
        except GeneratorExit:  # the consumer stopped reading mid-turn
            self._rollback(mark)
            raise
        if failed is not None:
            self._rollback(mark)
            yield failed

    def _steps(self, turn: int, text: str, tool_choice: str, now: datetime):
        """The engine calls of one turn; returns the TurnFailed to emit (after rollback) or None."""
        self.prompt.add_user(text, now=now, turn=turn)
        yield self._added(turn, "user", text)
        choice, n_calls, n_tools = tool_choice, 0, 0
        for step in range(self.limits.max_steps):
            eff = "none" if step == self.limits.max_steps - 1 else choice
            if self.system_timestamp:
                self.prompt.replace_system(self._system_text())
            forced = eff not in ("auto", "none")
            max_new = self.limits.call_max_tokens if forced else self.limits.max_tokens
            try:  # the context budget: may drop the oldest whole turns (a trim) so the call fits
                prep = self.context.prepare(self.prompt, self.detector, max_new)
            except ContextOverflow as e:
                return self._ev(TurnFailed, turn, f"the message does not fit this session's context: {e}; "
                                "the turn was undone, the conversation is as it was",
                                {"kind": "context"})
            ids, segs, check = prep.ids, prep.segments, prep.check
            self.call_index += 1
            call = self.call_index
            n_calls += 1
            yield self._ev(EngineCallStarted, turn, call, len(ids), eff)
            gen = None
            try:
                gen = self.session.generate(ids, self.sampling, max_new, constraint=self.constraint(eff))
                self._gen = gen
                if self._cancel.is_set() and hasattr(gen, "cancel"):
                    gen.cancel()
                shown = ""
                for _ in gen:
                    if self._cancel.is_set():
                        gen.close()  # an engine without Generation.cancel: stop between tokens
                        break
                    now_text = self.engine.tokenizer.decode(gen.tokens, skip_special_tokens=True)
                    if now_text.endswith("\ufffd"):
                        continue
                    yield self._ev(TokenDelta, turn, call, now_text[len(shown):])
                    shown = now_text
            except KvPoolFull as e:
                return self._ev(TurnFailed, turn, f"the KV pool is full: {e}", {"kind": "pool_full"})
            except (EngineError, ValueError) as e:
                return self._ev(TurnFailed, turn, f"engine call failed: {e}", {"kind": "engine"})
            finally:
                self._gen = None
            out = list(gen.tokens)
            stats = gen.stats
            if stats is None:  # nothing was computed (cancelled before the prefill began)
                return self._ev(TurnFailed, turn, "cancelled", {"kind": "cancelled"})
            self.detector.record(ids, segs, out, stats.finish_reason)
            yield self._ev(EngineCallFinished, turn, call, stats, check.reusable_tokens, len(out), eff,
                           context_budget=prep.budget.tokens, context_used=len(ids) + len(out),
                           trimmed_tokens=prep.trim.tokens if prep.trim else 0,
                           trim_recomputed_tokens=prep.recomputed(stats.computed_tokens))
            yield from self._cache_events(turn, call, gen.events)
            yield self._snapshot(turn, call)
            cached = stats.cached_tokens
            if check.broken:
                yield self._ev(PrefixBreak, turn, call, "trimmed" if prep.trim else "prompt changed",
                               check.common_tokens, check.segment or "?",
                               check.promised_tokens, cached, check.before, check.old, check.new, check.changed_segments)
            elif self.engine.prefix_cache:  # with the cache off nothing is promised
                short = self.detector.shortfall(check, stats)
                if short:
                    yield self._ev(PrefixBreak, turn, call, "cache shortfall", cached, segment_at(segs, cached),
                                   check.promised_tokens, cached, self._decode(ids[max(0, cached - 12):cached]),
                                   self._decode(ids[cached:cached + 12]), self._decode(ids[cached:cached + 12]))
            if self._cancel.is_set() or stats.finish_reason == "cancelled":
                return self._ev(TurnFailed, turn, "cancelled", {"kind": "cancelled", "call": call})
            if stats.finish_reason == "pool_full":
                return self._ev(TurnFailed, turn, "the KV pool filled during the reply", {"kind": "pool_full", "call": call})
            self.prompt.add_assistant(out)
            reply = self.engine.tokenizer.decode(out, skip_special_tokens=True)
            yield self._added(turn, "assistant", reply)
            if eff == "none" or split_call(reply, self.calls)[1] is None:
                yield self._ev(TurnFinished, turn, reply.strip(), step + 1, n_calls, n_tools)
                return None
            n_tools += 1
            yield from self.execute(reply, turn, f"call_{turn}_{n_tools}")
            choice = self.limits.follow_up
        return self._ev(TurnFailed, turn, "no answer within max_steps")  # unreachable: the last step is "none"
