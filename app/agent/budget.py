"""The context budget of a session, and the trim policy that keeps a long conversation inside it.

Budget: the tokens one engine call of this session may use (prompt + reply), the least of
- the model's context (max_position_embeddings),
- what the KV pool can give this session now: free pages + evictable pages (cached, neither
  pinned nor locked; the engine evicts them on demand) + the pages this session pinned itself
  (its static prefix, which its own prompt reuses); other sessions' pins and running calls'
  pages are not ours,
- an optional cap ([agent] context_tokens).

Trim: before each engine call, if prompt + the call's max new tokens would not fit the budget,
the oldest whole turns of the history are dropped until the prompt is at or under the
low-water mark (low_water x budget, default 60%), so a trim happens rarely and costs one
recomputation of the kept history. Never dropped: the static prefix (system prompt + tool
schemas: pinned, cached) and the turn in progress with its tool exchange. When even that does
not fit, the call is refused with ContextOverflow (the turn fails and is rolled back).

Trim ahead: after a turn ends, `ContextKeeper.ahead` asks whether the next turn — expected to
add as many tokens as the largest of the last three turns — would need a trim; if so the trim is
made now and the Agent computes the kept history into the prefix cache while the user reads and
types (an engine call of its own, kind "trim"), so the next call serves it from the cache instead
of recomputing it before its first token. Cancelled (the user sent the next message first), the
pages done stay cached and the next call computes the rest; its ledger counts those tokens as
the trim's recomputation (`carried`).

`plan_trim` is the pure policy on token spans; `ContextKeeper` applies it to an Agent's
CanonicalPrompt and PrefixDetector before each call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.agent.cachecheck import PrefixCheck, PrefixDetector
from app.agent.prompt import CanonicalPrompt, Segment, Trim, TurnSpan


class ContextOverflow(ValueError):
    """The turn in progress alone does not fit the session's context budget."""


# ---- the budget -----------------------------------------------------------------------------
@dataclass(frozen=True)
class BudgetPolicy:
    """How a session keeps inside its budget. low_water: the fraction of the budget a trim cuts
    the prompt down to; max_context: a cap in tokens below the model and the pool (0: none);
    ahead: trim after a turn when the next one is expected not to fit (Agent.trim_ahead)."""

    low_water: float = 0.6
    max_context: int = 0
    ahead: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.low_water < 1.0:
            raise ValueError(f"[agent] trim_low_water must be in (0, 1), got {self.low_water}")
        if self.max_context < 0:
            raise ValueError(f"[agent] context_tokens must be >= 0 (0: no cap), got {self.max_context}")


@dataclass(frozen=True)
class ContextBudget:
    tokens: int  # prompt + reply tokens one call may use: min(model, pool, cap)
    model_context: int
    pool_tokens: int  # (free + evictable + own pinned pages) x block, at the time of the call
    cap: int  # the policy's cap (0: none)


def context_budget(snapshot: dict, model_context: int, own_pinned_pages: int = 0, cap: int = 0) -> ContextBudget:
    """The budget from an engine.snapshot() dict (free_pages, evictable_pages, pinned_pages, block)."""
    own = max(0, min(own_pinned_pages, snapshot["pinned_pages"]))
    pool = (snapshot["free_pages"] + snapshot["evictable_pages"] + own) * snapshot["block"]
    tokens = min(model_context, pool, cap) if cap > 0 else min(model_context, pool)
    return ContextBudget(tokens, model_context, pool, cap)


# ---- the policy, on token spans ----------------------------------------------------------------
@dataclass(frozen=True)
class TrimPlan:
    drop: int  # how many of the oldest history turns to drop
    dropped_tokens: int
    prompt_tokens: int  # the request before the trim
    kept_tokens: int  # ... and after
    target_tokens: int  # the low-water mark
    fits: bool  # kept_tokens + reserve <= budget


def plan_trim(prompt_tokens: int, history: Sequence[TurnSpan], reserve: int, budget: int,
              low_water: float = 0.6) -> TrimPlan | None:
    """Which oldest whole turns to drop so the next call fits; None when it fits already.

    `prompt_tokens` is the whole request; `history` the droppable turns, oldest first (not the
    static prefix, not the turn in progress); `reserve` the call's max new tokens. Drops turns
    until the request is at or under floor(low_water x budget) and request + reserve fits, or
    nothing droppable is left (then `fits` is False).
    """
    if prompt_tokens + reserve <= budget:
        return None
    target = math.floor(low_water * budget)
    kept, drop, dropped = prompt_tokens, 0, 0
    for span in history:
        if kept <= target and kept + reserve <= budget:
            break
        kept -= len(span)
        dropped += len(span)
        drop += 1
    return TrimPlan(drop, dropped, prompt_tokens, kept, target, kept + reserve <= budget)


# ---- applied to an agent's prompt -----------------------------------------------------------
@dataclass(frozen=True)
class PreparedCall:
    """A call's request after the budget check: what to send, the detector's check of it, the
    budget, the trim (if one happened) and what the call would have computed without it."""

    ids: list[int]
    segments: list[Segment]
    check: PrefixCheck
    budget: ContextBudget
    trim: Trim | None = None
    untrimmed_computed: int = 0  # tokens the untrimmed request would have computed (not reusable)
    carried: int = 0  # kept-history tokens a cancelled trim-ahead left for this call to compute

    def recomputed(self, computed_tokens: int) -> int:
        """Tokens computed because of the trim: the kept history, now at new positions (or what a
        cancelled trim-ahead left of it)."""
        if self.trim:
            return max(0, computed_tokens - self.untrimmed_computed)
        return min(computed_tokens, self.carried)


def expected_turn_tokens(history: Sequence[TurnSpan], last: int = 3) -> int:
    """What the next turn is expected to add: the largest of the last `last` turns (a user message,
    its tool exchange and the reply), 0 without history."""
    return max((len(s) for s in history[-last:]), default=0)


@dataclass(frozen=True)
class AheadTrim:
    """A trim made after a turn ended, for the next one: what it dropped and the prompt it left."""

    trim: Trim
    budget: ContextBudget
    expected_tokens: int  # what the next turn was expected to add (its header included)


class ContextKeeper:
    """One session's context budget. Owned by the Agent; `prepare` may trim the Agent's prompt
    (CanonicalPrompt.trim) and reads the detector without mutating it."""

    def __init__(self, engine, policy: BudgetPolicy = BudgetPolicy()):
        self.engine = engine
        self.policy = policy
        self.model_context = engine.config.max_position_embeddings
        self.pinned_tokens = 0  # the static prefix this session pinned (Agent.prewarm sets it)
        self.trims: list[Trim] = []  # every trim made, oldest first (Trim.describe() says what it did)
        self.carried = 0  # kept-history tokens a cancelled trim-ahead left uncomputed (the next call's)

    def budget(self) -> ContextBudget:
        snap = self.engine.snapshot()
        own = self.pinned_tokens // max(1, snap["block"])
        return context_budget(snap, self.model_context, own, self.policy.max_context)

    def prepare(self, prompt: CanonicalPrompt, detector: PrefixDetector, reserve: int) -> PreparedCall:
        """The next request; trims the oldest whole turns first when it would not fit.

        Raises ContextOverflow (nothing trimmed) when the turn in progress alone does not fit.
        """
        ids, segs = prompt.request()
        check = detector.check(ids, segs)
        budget = self.budget()
        history = prompt.turns()[:-1]  # the last turn is the one in progress
        plan = plan_trim(len(ids), history, reserve, budget.tokens, self.policy.low_water)
        carried, self.carried = self.carried, 0
        if plan is None:
            return PreparedCall(ids, segs, check, budget, carried=carried)
        if not plan.fits:
            raise ContextOverflow(
                f"the turn in progress needs {plan.kept_tokens} prompt tokens + {reserve} for the reply, more than "
                f"this session's context budget of {budget.tokens} tokens (model context {budget.model_context}, "
                f"KV pool free to this session {budget.pool_tokens}) even with all {len(history)} older turns dropped")
        untrimmed_computed = len(ids) - check.reusable_tokens
        trim = prompt.trim(plan.drop)  # plan.drop >= 1 here: the request did not fit as it was
        self.trims.append(trim)
        ids, segs = prompt.request()
        check = detector.check(ids, segs)
        if check.broken:  # the kept history moved: a trim, not a cache killer (segment "history")
            check = replace(check, segment="history", changed_segments=trim.segments)
        return PreparedCall(ids, segs, check, budget, trim, untrimmed_computed)

    def ahead(self, prompt: CanonicalPrompt, reserve: int) -> AheadTrim | None:
        """After a turn ended: trim now (CanonicalPrompt.trim) when the next turn, expected to add
        expected_turn_tokens() + the assistant header, would not fit with `reserve` for its reply;
        None (nothing changed) when it would fit or there is no older turn to drop. The last turn
        is always kept."""
        spans = prompt.turns()
        if len(spans) < 2:
            return None
        budget = self.budget()
        expected = expected_turn_tokens(spans) + prompt.header_tokens
        plan = plan_trim(len(prompt.ids) + expected, spans[:-1], reserve, budget.tokens, self.policy.low_water)
        if plan is None or plan.drop == 0:
            return None
        trim = prompt.trim(plan.drop)
        self.trims.append(trim)
        return AheadTrim(trim, budget, expected)
