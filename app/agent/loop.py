"""The agent loop: one conversation on one engine Session, a generator of typed events.

    agent = Agent(engine, Toolkit(fns))
    for event in agent.run_turn("How hot is the board?", tool_choice="auto"):
        match event: ...

Per user turn, at most `max_steps` engine calls: each call sends the whole canonical prompt
(token ids, appended to, never re-rendered); a reply that is a tool call is executed through the
toolkit (errors go back to the model as tool results) and the loop calls the engine again; a
plain reply ends the turn. A forced tool_choice (required / a tool's name) applies to the first
call of the turn, then `follow_up` ("auto" by default); the last allowed step is "none", so every turn ends in an answer.

Imports: app.engine and app.events only (never the store, the UI or textual).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from app.agent.cachecheck import PrefixDetector, lint_prompt, segment_at
from app.agent.constrain import (GrammarConstraint, RepetitionGuard, TriggeredConstraint, call_grammar, ll_tokenizer,
                                 no_opener_mask)
from app.agent.parse import CallParseError, parse_call, split_call, call_format_for
from app.agent.prompt import SYSTEM_PROMPT, CanonicalPrompt
from app.agent.toolkit import Toolkit, ToolResult
from app.engine import Engine, EngineError, SamplingParams
from app.engine.chat_format import chat_format_for
from app.events import (
    EngineCallFinished,
    EngineCallStarted,
    Event,
    PrefixBreak,
    PromptLinted,
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
    """A conversation with tools. Owns its Session, CanonicalPrompt and PrefixDetector; one caller at a time.

    `system_timestamp=True` reproduces the classic cache killer (the system prompt re-rendered
    with the current time before every call); it exists to demonstrate the detector and the gate.
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
    ):
        cfg = engine.config
        self.engine = engine
        self.toolkit = toolkit
        self.limits = limits
        self.sampling = sampling
        self.session = engine.session(name)
        self.clock = clock or (lambda: datetime.now().astimezone())
        self.chat = chat_format_for(cfg.chat_format, engine.tokenizer)
        self.calls = call_format_for(cfg.chat_format, cfg.chat_template)
        self.base_system = system_prompt
        self.system_timestamp = system_timestamp
        self.prompt = CanonicalPrompt(self.chat, self.calls, toolkit.schemas, self._system_text())
        self.detector = PrefixDetector(self._decode)
        self.turn = 0
        self.call_index = 0
        self._llt = None
        self._no_opener = None
        self._grammars: dict[str, str] = {}

    def prewarm(self) -> int:
        """Compute, cache and pin the static prefix (system prompt + tool schemas) before the
        first turn, so even the first call only computes its own message (seed 000 §6).
        Returns the tokens pinned (whole pages); the pin lasts as long as the session."""
        static = self.prompt.ids[: self.prompt.segments[1].end]
        return self.session.prewarm(static)

    # ---- helpers ------------------------------------------------------------------------
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

    def execute(self, reply: str, turn: int, call_id: str) -> Iterator[Event]:
        """Parse and run the tool call in `reply`; append its result to the prompt. Never raises."""
        _, raw = split_call(reply, self.calls)
        raw = raw or reply
        try:
            call = parse_call(raw, self.calls)
        except CallParseError as e:
            yield ToolCalled(turn, call_id, "", None, raw)
            result = ToolResult(False, f"error: {e}", 0.0)
            yield ToolReturned(turn, call_id, "", False, result.content, 0.0)
        else:
            yield ToolCalled(turn, call_id, call.name, call.arguments, raw)
            result = self.toolkit.call(call.name, call.arguments)
            yield ToolReturned(turn, call_id, call.name, result.ok, result.content, result.elapsed_s)
        self.prompt.add_tool_result(result.content)

    # ---- the turn -------------------------------------------------------------------------
    def run_turn(self, text: str, tool_choice: str = "auto") -> Iterator[Event]:
        """Run one user turn to its answer, yielding events. Errors end the turn, not the session."""
        if tool_choice not in ("auto", "required", "none") and tool_choice not in self.toolkit.tools:
            raise ValueError(f"tool_choice {tool_choice!r}: no such tool (auto, required, none, {', '.join(self.toolkit.names)})")
        self.turn += 1
        turn = self.turn
        yield TurnStarted(turn, text, tool_choice)
        if turn == 1:
            issues = self.lint()
            if issues:
                yield PromptLinted(tuple(issues))
        self.prompt.add_user(text, now=self.clock(), turn=turn)
        choice, n_calls, n_tools = tool_choice, 0, 0
        for step in range(self.limits.max_steps):
            eff = "none" if step == self.limits.max_steps - 1 else choice
            if self.system_timestamp:
                self.prompt.replace_system(self._system_text())
            ids, segs = self.prompt.request()
            check = self.detector.check(ids, segs)
            forced = eff not in ("auto", "none")
            self.call_index += 1
            n_calls += 1
            yield EngineCallStarted(turn, self.call_index, len(ids), eff)
            try:
                gen = self.session.generate(
                    ids, self.sampling, self.limits.call_max_tokens if forced else self.limits.max_tokens,
                    constraint=self.constraint(eff))
                shown = ""
                for _ in gen:
                    now_text = self.engine.tokenizer.decode(gen.tokens, skip_special_tokens=True)
                    if now_text.endswith("\ufffd"):
                        continue
                    yield TokenDelta(turn, self.call_index, now_text[len(shown):])
                    shown = now_text
            except (EngineError, ValueError) as e:
                yield TurnFailed(turn, f"engine call failed: {e}")
                return
            out = list(gen.tokens)
            stats = gen.stats
            self.detector.record(ids, segs, out, stats.finish_reason)
            yield EngineCallFinished(turn, self.call_index, stats, check.reusable_tokens, len(out), eff)
            cached = getattr(stats, "cached_tokens", 0)
            if check.broken:
                yield PrefixBreak(turn, self.call_index, "prompt changed", check.common_tokens, check.segment or "?",
                                  check.promised_tokens, cached, check.before, check.old, check.new,
                                  check.changed_segments)
            else:
                short = self.detector.shortfall(check, stats)
                if short:
                    yield PrefixBreak(turn, self.call_index, "cache shortfall", cached, segment_at(segs, cached),
                                      check.promised_tokens, cached, self._decode(ids[max(0, cached - 12):cached]),
                                      self._decode(ids[cached:cached + 12]), self._decode(ids[cached:cached + 12]))
            self.prompt.add_assistant(out)
            reply = self.engine.tokenizer.decode(out, skip_special_tokens=True)
            if eff == "none" or split_call(reply, self.calls)[1] is None:
                yield TurnFinished(turn, reply.strip(), step + 1, n_calls, n_tools)
                return
            n_tools += 1
            yield from self.execute(reply, turn, f"call_{turn}_{n_tools}")
            choice = self.limits.follow_up
        yield TurnFailed(turn, "no answer within max_steps")  # unreachable: the last step is "none"
