"""The context budget: the trim policy on token spans (pure), CanonicalPrompt.trim on real token ids,
and a long conversation on a tiny KV pool that must trim instead of failing."""

from __future__ import annotations

import functools
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.agent.budget import BudgetPolicy, ContextOverflow, context_budget, plan_trim
from app.agent.prompt import CanonicalPrompt, TurnSpan


# ---- the policy on spans ---------------------------------------------------------------------
def spans(static: int, sizes: list[int]) -> list[TurnSpan]:
    out, at = [], static
    for i, n in enumerate(sizes, 1):
        out.append(TurnSpan(i, at, at + n, 2))
        at += n
    return out


def test_no_trim_while_the_call_fits():
    hist = spans(300, [50] * 4)
    assert plan_trim(300 + 200 + 40, hist, reserve=16, budget=600) is None
    assert plan_trim(584, hist, reserve=16, budget=600) is None  # exactly full still fits


def test_drops_oldest_whole_turns_down_to_the_low_water_mark():
    static, sizes, current = 300, [50, 60, 70, 80, 90], 40
    hist = spans(static, sizes)
    prompt = static + sum(sizes) + current  # 690
    plan = plan_trim(prompt, hist, reserve=16, budget=700, low_water=0.6)
    assert plan is not None and plan.fits
    assert plan.target_tokens == 420
    # whole turns, oldest first: dropping 50, 60, 70, 80 leaves 430 > 420; the fifth (90) leaves 340
    assert plan.drop == 5 and plan.dropped_tokens == sum(sizes)
    assert plan.kept_tokens == static + current <= plan.target_tokens
    # a looser mark stops as soon as it is reached, never inside a turn
    plan = plan_trim(prompt, hist, reserve=16, budget=700, low_water=0.9)
    assert plan.drop == 2 and plan.kept_tokens == prompt - 110 <= 630


def test_the_static_prefix_and_the_turn_in_progress_are_never_dropped():
    # the turn in progress (a big tool exchange) alone is over the budget: nothing to drop can save it
    hist = spans(300, [50, 50])
    plan = plan_trim(300 + 100 + 500, hist, reserve=16, budget=700)
    assert plan.drop == 2 and not plan.fits and plan.kept_tokens == 800
    assert plan_trim(900, [], reserve=16, budget=700).fits is False


def test_a_large_reply_reserve_drops_past_the_mark():
    hist = spans(100, [40] * 5)
    plan = plan_trim(100 + 200 + 20, hist, reserve=200, budget=400, low_water=0.6)
    assert plan.kept_tokens + 200 <= 400 and plan.fits  # under the mark is not enough: the reply must fit


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.lists(st.integers(1, 120), max_size=30), st.integers(1, 400),
       st.integers(0, 200), st.integers(200, 4000), st.floats(0.1, 0.95))
def test_trim_plan_is_the_fewest_oldest_turns_that_reach_the_mark(static, sizes, current, reserve, budget, low):
    hist = spans(static, sizes)
    prompt = static + sum(sizes) + current
    plan = plan_trim(prompt, hist, reserve, budget, low)
    if prompt + reserve <= budget:
        assert plan is None
        return
    assert plan.dropped_tokens == sum(sizes[: plan.drop]) and plan.kept_tokens == prompt - plan.dropped_tokens
    assert plan.kept_tokens >= static + current  # the static prefix and the turn in progress stay
    done = lambda kept: kept <= plan.target_tokens and kept + reserve <= budget  # noqa: E731
    assert plan.fits == (plan.kept_tokens + reserve <= budget)
    assert done(plan.kept_tokens) or plan.drop == len(sizes)  # reached the mark, or nothing left to drop
    if plan.drop:  # and not one turn more than needed
        assert not done(plan.kept_tokens + sizes[plan.drop - 1])


def test_budget_is_the_least_of_model_pool_and_cap():
    snap = {"free_pages": 10, "evictable_pages": 20, "pinned_pages": 25, "locked_pages": 3, "block": 16}
    b = context_budget(snap, model_context=8192, own_pinned_pages=19)
    assert b.pool_tokens == (10 + 20 + 19) * 16 and b.tokens == b.pool_tokens  # others' 6 pinned pages are not ours
    assert context_budget(snap, model_context=512, own_pinned_pages=19).tokens == 512
    assert context_budget(snap, 8192, 19, cap=300).tokens == 300
    with pytest.raises(ValueError, match="trim_low_water"):
        BudgetPolicy(low_water=1.5)


def test_default_pool_holds_the_models_context_or_the_memory_budget(root):
    from dataclasses import replace

    from app.__main__ import _pool
    from app.config import EngineSettings
    from app.engine.loader import read_config, resolve_model_dir

    ctx = read_config(resolve_model_dir(root, "nvfp4")).max_position_embeddings
    s = replace(EngineSettings(), model=str(root))  # defaults: max_context 0 (the model's), kv_mib 512, f32 KV
    assert _pool(s) == {"max_context": ctx}  # 8192 tokens x 46,080 B = 360 MiB: under the 512 MiB budget
    assert _pool(replace(s, kv_mib=100.0)) == {"kv_mib": 100.0}  # the budget is smaller: it wins
    assert _pool(replace(s, kv="f16", kv_mib=200.0)) == {"max_context": ctx}  # f16 halves it: 180 MiB fits
    assert _pool(replace(s, max_context=2048, kv_mib=0)) == {"max_context": 2048}
    assert _pool(s, kv_pages=40) == {"kv_pages": 40}


# ---- CanonicalPrompt.trim on real ids ----------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _chat(root):
    from app.agent.parse import call_format_for
    from app.engine.chat_format import chat_format_for
    from app.engine.loader import read_config, read_tokenizer, resolve_model_dir

    d = resolve_model_dir(root, "nvfp4")
    cfg = read_config(d)
    return chat_format_for(cfg.chat_format, read_tokenizer(d)), call_format_for(cfg.chat_format, cfg.chat_template)


def test_trim_keeps_the_kept_turns_ids_exactly(root):
    chat, calls = _chat(root)
    schema = {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}
    p = CanonicalPrompt(chat, calls, [schema])
    t0 = datetime(2026, 5, 9, 7, 35, tzinfo=timezone.utc)
    for t in range(1, 6):
        p.add_user(f"question {t}", now=t0, turn=t)
        p.add_assistant(chat.encode(f"answer {t}"))
        if t == 3:
            p.add_tool_result("a tool result")
            p.add_assistant(chat.encode("after the tool"))
    static = p.ids[: p.static_tokens]
    before = list(p.ids)
    turns = p.turns()
    assert [t.turn for t in turns] == [1, 2, 3, 4, 5] and turns[2].messages == 4
    trim = p.trim(3)
    assert trim.turns == (1, 2, 3) and trim.messages == 8
    assert p.ids == static + before[turns[3].start:]  # same ids, no re-tokenisation
    assert trim.tokens == turns[3].start - len(static) and trim.after == len(p.ids)
    assert [s.name for s in p.segments][2:] == ["history[8]:user", "history[9]:assistant",
                                                 "history[10]:user", "history[11]:assistant"]
    for s in p.segments:
        assert s.end <= len(p.ids)
    assert "context trimmed: dropped turns 1–3" in trim.describe()
    with pytest.raises(ValueError, match="turn in progress"):
        p.trim(2)  # only one older turn is left
    state = p.checkpoint()
    p.add_user("question 6", now=t0, turn=6)
    p.restore(state)
    assert p.ids == static + before[turns[3].start:] and [t.turn for t in p.turns()] == [4, 5]


# ---- a long conversation on a tiny pool -----------------------------------------------------------
def test_fifteen_turns_on_a_forty_page_pool_trim_and_never_fail(root, tmp_path):
    import tools
    from app.agent import Agent, AgentLimits, Toolkit
    from app.engine import load_engine
    from app.events import EngineCallFinished, PrefixBreak, TurnFailed, TurnFinished

    tools.configure(workspace=tmp_path, notes_dir=tools.notes_dir())
    eng = load_engine(root, weights="nvfp4", threads=1, kv_pages=40)
    # low water 80%: a trim keeps a couple of turns (at 60% of 640 tokens only the static prefix would stay)
    agent = Agent(eng, Toolkit([tools.calculate, tools.now]), limits=AgentLimits(max_steps=1, max_tokens=8),
                  budget=BudgetPolicy(low_water=0.8))
    agent.prewarm()
    events = [e for t in range(15) for e in agent.run_turn(f"Say hello number {t}.", tool_choice="none")]
    assert not [e for e in events if isinstance(e, TurnFailed)]
    assert len([e for e in events if isinstance(e, TurnFinished)]) == 15
    calls = [e for e in events if isinstance(e, EngineCallFinished) and getattr(e.stats, "kind", "") != "prewarm"]
    trims = [c for c in calls if c.trimmed_tokens > 0]
    assert trims, "a 640-token pool cannot hold 15 turns without a trim"
    for c in calls:
        assert 0 < c.context_used <= c.context_budget <= 40 * 16
    for c in trims:
        # the pinned static prefix is still served from the cache; the kept history is recomputed
        assert c.stats.cached_tokens >= agent.prompt.static_tokens // 16 * 16
        assert c.trim_recomputed_tokens > 0
    breaks = [b for b in events if isinstance(b, PrefixBreak)]
    assert breaks and all(b.cause == "trimmed" and b.segment == "history" for b in breaks)
    assert {b.call for b in breaks} == {c.call for c in trims}
    assert [t.tokens for t in agent.context.trims] == [c.trimmed_tokens for c in trims]
    assert all(t.describe().startswith("context trimmed: dropped turn") for t in agent.context.trims)
    with pytest.raises(ContextOverflow):  # the turn in progress alone can be too big: a clear error, no trim
        agent.context.prepare(agent.prompt, agent.detector, reserve=10_000)


def test_a_turn_that_cannot_fit_fails_cleanly_and_the_next_turn_works(root, tmp_path):
    import tools
    from app.agent import Agent, AgentLimits, Toolkit
    from app.agent.budget import ContextBudget
    from app.engine import load_engine
    from app.events import PrefixBreak, TurnFailed, TurnFinished

    tools.configure(workspace=tmp_path, notes_dir=tools.notes_dir())
    eng = load_engine(root, weights="nvfp4", threads=1, kv_pages=40)
    agent = Agent(eng, Toolkit([tools.calculate, tools.now]), limits=AgentLimits(max_steps=1, max_tokens=8))
    agent.prewarm()
    assert isinstance(list(agent.run_turn("Hello.", "none"))[-1], TurnFinished)
    before = list(agent.prompt.ids)
    huge = "word " * 400  # ~400 tokens + the 311-token static prefix: more than the 640-token pool

    # the budget refuses it before the engine is called
    (failed,) = [e for e in agent.run_turn(huge, "none") if isinstance(e, TurnFailed)]
    assert failed.details["kind"] == "context" and "context budget of 640 tokens" in failed.error
    assert "undone" in failed.error and agent.prompt.ids == before  # no orphan user message

    # a budget that lies (as if another session freed pages that it did not): the engine's own
    # KvPoolFull ends the turn, and it is rolled back too
    real = agent.context.budget
    agent.context.budget = lambda: ContextBudget(100_000, 8192, 100_000, 0)
    (failed,) = [e for e in agent.run_turn(huge, "none") if isinstance(e, TurnFailed)]
    assert failed.details["kind"] == "pool_full" and agent.prompt.ids == before
    agent.context.budget = real

    events = list(agent.run_turn("Hello again.", "none"))
    assert isinstance(events[-1], TurnFinished)
    assert not [e for e in events if isinstance(e, PrefixBreak)]  # the failed turns left no trace in the prefix
    eng.check_integrity()


# ---- trim ahead ---------------------------------------------------------------------------------
def _long_session(root, tmp_path, ahead: bool, turns: int = 12):
    import tools
    from app.agent import Agent, AgentLimits, Toolkit
    from app.engine import load_engine

    tools.configure(workspace=tmp_path, notes_dir=tools.notes_dir())
    eng = load_engine(root, weights="nvfp4", threads=1, kv_pages=40)
    agent = Agent(eng, Toolkit([tools.calculate, tools.now]), limits=AgentLimits(max_steps=1, max_tokens=8),
                  budget=BudgetPolicy(low_water=0.8, ahead=ahead))
    agent.prewarm()
    events = []
    for t in range(turns):
        events += agent.run_turn(f"Say hello number {t}.", tool_choice="none")
        if t + 1 < turns:
            events += agent.trim_ahead()  # between turns, as the console does
    return eng, agent, events


def test_trim_ahead_makes_the_trim_between_turns_and_the_next_call_reuses_it(root, tmp_path):
    from app.events import EngineCallFinished, PrefixBreak, TurnFailed, TurnFinished

    eng, agent, events = _long_session(root, tmp_path, ahead=True)
    assert not [e for e in events if isinstance(e, TurnFailed)]
    assert len([e for e in events if isinstance(e, TurnFinished)]) == 12
    calls = [e for e in events if isinstance(e, EngineCallFinished) and e.stats.kind != "prewarm"]
    ahead = [i for i, c in enumerate(calls) if c.stats.kind == "trim"]
    assert ahead, "a 640-token pool cannot hold 12 turns without a trim"
    assert not [c for c in calls if c.stats.kind == "generate" and c.trimmed_tokens], \
        "every trim was made ahead: no reply call waited for one"
    for i in ahead:
        trim, nxt = calls[i], calls[i + 1]
        st = trim.stats
        # its own ledger row: the kept history computed (not served), nothing generated
        assert st.decode_tokens == 0 and trim.output_tokens == 0 and st.finish_reason == "stop"
        assert st.cached_tokens + st.computed_tokens == st.prompt_tokens
        assert trim.trim_recomputed_tokens == st.computed_tokens > 0 and trim.trimmed_tokens > 0
        assert st.cached_tokens >= agent.prompt.static_tokens // 16 * 16  # the pinned static prefix
        # the next reply's prompt extends the trimmed one and is served from the cache up to it
        assert nxt.stats.kind == "generate" and nxt.trim_recomputed_tokens == 0
        assert nxt.stats.cached_tokens >= st.prompt_tokens // 16 * 16
    breaks = [b for b in events if isinstance(b, PrefixBreak)]
    assert {b.call for b in breaks} == {calls[i].call for i in ahead}  # the trims' own, none on a reply
    assert all(b.cause == "trimmed" and b.segment == "history" for b in breaks)
    assert [t.tokens for t in agent.context.trims] == [calls[i].trimmed_tokens for i in ahead]
    eng.check_integrity()

    # the same conversation with trims made in the calls: the user waits for the recomputation there
    _, _, events_in = _long_session(root, tmp_path, ahead=False)
    in_call = [e for e in events_in if isinstance(e, EngineCallFinished) and e.trimmed_tokens]
    assert in_call and all(c.stats.kind == "generate" for c in in_call)
    worst_wait = max(calls[i + 1].stats.computed_tokens for i in ahead)
    assert worst_wait < min(c.stats.computed_tokens for c in in_call)


def test_a_cancelled_trim_ahead_leaves_the_rest_to_the_next_call(root, tmp_path):
    from app.events import EngineCallFinished, EngineCallStarted, PrefixBreak

    eng, agent, events = _long_session(root, tmp_path, ahead=False, turns=6)
    agent.context.policy = BudgetPolicy(low_water=0.5, ahead=True)
    # a cap that the next turn would pass: the trim is due now
    agent.context.policy = BudgetPolicy(low_water=0.5, max_context=len(agent.prompt.ids) + 24, ahead=True)
    gen = agent.trim_ahead()
    started = next(gen)
    assert isinstance(started, EngineCallStarted)
    agent.cancel()  # the user sent the next message before the computation began
    rest = list(gen)
    (trim,) = [e for e in rest if isinstance(e, EngineCallFinished)]
    st = trim.stats
    assert st.kind == "trim" and st.finish_reason == "cancelled"
    left = st.prompt_tokens - st.cached_tokens - st.computed_tokens
    assert left > 0 and agent.context.carried == left
    agent.context.policy = BudgetPolicy(low_water=0.5, ahead=True)  # the cap gone: the next call fits untrimmed
    after = list(agent.run_turn("And now?", tool_choice="none"))
    (nxt,) = [e for e in after if isinstance(e, EngineCallFinished)]
    assert nxt.trimmed_tokens == 0 and nxt.trim_recomputed_tokens == left  # the rest, counted as the trim's
    assert nxt.stats.computed_tokens >= left
    assert not [b for b in after if isinstance(b, PrefixBreak)]  # a shortfall was expected, not reported
    assert agent.context.carried == 0
    eng.check_integrity()


def test_no_trim_ahead_while_the_next_turn_fits(root, tmp_path):
    _, agent, events = _long_session(root, tmp_path, ahead=True, turns=2)
    assert list(agent.trim_ahead()) == [] and not agent.context.trims
