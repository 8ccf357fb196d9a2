"""The agent loop with the real engine and the default model (short generations), and the
prefix-break detector / lint on token ids alone."""

from __future__ import annotations

import functools
import itertools
from datetime import datetime, timedelta, timezone

import pytest

from app.agent import Agent, AgentLimits, Toolkit
from app.agent.cachecheck import PrefixDetector, floor_page, lint_prompt
from app.agent.prompt import Segment
from app.events import EngineCallFinished, MessageAdded, PrefixBreak, PromptLinted, ToolCalled, ToolReturned, TurnFinished


@functools.lru_cache(maxsize=None)
def _engine(root):
    from app.engine import load_engine

    return load_engine(root, weights="nvfp4", threads=1)  # one thread: shared CI cores oversubscribe OpenMP


@pytest.fixture()
def eng(root):
    return _engine(root)


@pytest.fixture()
def ws(tmp_path):
    import tools

    tools.configure(workspace=tmp_path, notes_dir=tools.notes_dir())
    return tmp_path


def ticking_clock():
    t0 = datetime(2026, 5, 9, 7, 35, 25, tzinfo=timezone.utc)
    ticks = itertools.count()
    return lambda: t0 + timedelta(seconds=7 * next(ticks))


def spy(agent):
    """Record (prompt ids, Generation) of every engine call the agent makes."""
    calls = []
    real = agent.session.generate

    def generate(prompt, *a, **k):
        g = real(prompt, *a, **k)
        calls.append((list(prompt), g))
        return g

    agent.session.generate = generate
    return calls


def test_forced_call_runs_and_the_next_prompt_extends_the_last(eng, ws):
    import tools

    agent = Agent(eng, Toolkit([tools.calculate, tools.now]), limits=AgentLimits(max_steps=2, max_tokens=24),
                  clock=ticking_clock())
    calls = spy(agent)
    events = list(agent.run_turn("What is 17 times 23?", tool_choice="calculate"))
    called = [e for e in events if isinstance(e, ToolCalled)]
    returned = [e for e in events if isinstance(e, ToolReturned)]
    ledger = [e for e in events if isinstance(e, EngineCallFinished)]
    assert len(called) == 1 and called[0].name == "calculate" and "expression" in called[0].arguments
    assert len(returned) == 1 and returned[0].content  # ok or a tool error: either is a result for the model
    assert isinstance(events[-1], TurnFinished) and len(calls) == 2 and len(ledger) == 2
    (p1, g1), (p2, g2) = calls
    assert g1.stats.finish_reason == "stop"  # the grammar closed the call
    # token-level append: call 2's prompt = call 1's prompt + output + (closing, tool result, header)
    assert p2[: len(p1) + len(g1.tokens)] == p1 + g1.tokens
    tool_text = eng.tokenizer.decode(p2[len(p1) + len(g1.tokens):])
    assert returned[0].content[:20] in tool_text
    assert ledger[1].reusable_tokens == floor_page(len(p1) + len(g1.tokens))
    assert not any(isinstance(e, PrefixBreak) for e in events)
    assert g2.stats.cached_tokens >= floor_page(len(p1) + len(g1.tokens))


def test_timestamp_in_system_prompt_is_caught(eng, ws):
    import tools

    def two_turns(**kw):
        agent = Agent(eng, Toolkit([tools.now]), limits=AgentLimits(max_steps=1, max_tokens=4), clock=ticking_clock(), **kw)
        return [e for t in ("Hello.", "And now?") for e in agent.run_turn(t, tool_choice="none")]

    clean = two_turns()
    assert not [e for e in clean if isinstance(e, (PrefixBreak, PromptLinted))]
    assert [e for e in clean if isinstance(e, EngineCallFinished)][1].reusable_tokens > 0

    broken = two_turns(system_timestamp=True)
    lint = [e for e in broken if isinstance(e, PromptLinted)]
    assert lint and "timestamp" in lint[0].issues[0]
    (brk,) = [e for e in broken if isinstance(e, PrefixBreak)]
    assert brk.segment == "system" and brk.cause == "prompt changed" and "system" in brk.changed_segments
    assert brk.old != brk.new and brk.index > 0
    assert [e for e in broken if isinstance(e, EngineCallFinished)][1].reusable_tokens < brk.index + 16


def test_bad_tool_calls_do_not_end_the_session(eng, ws):
    import time

    import tools

    def boom(x: int) -> int:
        """Always raises."""
        raise RuntimeError("kaput")

    def hang(x: int) -> int:
        """Never returns in time."""
        time.sleep(30)
        return x

    kit = Toolkit([tools.read_file, boom, hang], timeout_s=0.3)
    agent = Agent(eng, kit, limits=AgentLimits(max_steps=1, max_tokens=4))
    cases = {
        '<tool_call>{"name":"read_file","arguments":{"path":"../../etc/passwd"}}</tool_call>': "PermissionError",
        '<tool_call>{"name":"boom","arguments":{"x":1}}</tool_call>': "RuntimeError: kaput",
        '<tool_call>{"name":"hang","arguments":{"x":1}}</tool_call>': "timed out",
        '<tool_call>{"name":"rm_rf","arguments":{}}</tool_call>': "unknown tool 'rm_rf'",
        '<tool_call>{"name":"read_file","arguments":{"path":}}</tool_call>': "not valid JSON",
        '<tool_call>{"name":"read_file","arguments":"x"}</tool_call>': "must be a JSON object",
        '<tool_call>{"name":"boom","arguments":{"x":1}}': "no closing",
    }
    for raw, expect in cases.items():
        n = len(agent.prompt.ids)
        (called, returned, added) = list(agent.execute(raw, 1, "c"))
        assert not returned.ok and expect in returned.content, returned.content
        assert len(agent.prompt.ids) > n  # the error went into the conversation as a tool result
        assert isinstance(added, MessageAdded) and added.role == "tool" and (added.start, added.end) == (n, len(agent.prompt.ids))
    events = list(agent.run_turn("Thanks.", tool_choice="none"))
    assert isinstance(events[-1], TurnFinished)


def test_detector_on_token_ids_alone():
    decode = lambda ids: " ".join(map(str, ids))  # noqa: E731
    det = PrefixDetector(decode)
    segs = [Segment("system", 0, 40, "a"), Segment("tools", 40, 80, "b"), Segment("user", 80, 90, "c")]
    p1 = list(range(90))
    assert not det.check(p1, segs).broken and det.check(p1, segs).reusable_tokens == 0
    det.record(p1, segs, [900, 901, 902])
    ok = det.check(p1 + [900, 901, 902] + list(range(200, 230)), segs + [Segment("user", 93, 123, "d")])
    assert not ok.broken and ok.promised_tokens == ok.reusable_tokens == 80
    changed = list(p1)
    changed[45] = -1
    segs2 = [segs[0], Segment("tools", 40, 80, "x"), segs[2]]
    bad = det.check(changed + [900, 901, 902, 5], segs2)
    assert bad.broken and bad.common_tokens == 45 and bad.segment == "tools" and bad.reusable_tokens == 32
    assert bad.changed_segments == ("tools",) and bad.old.startswith("45") and bad.new.startswith("-1")


def test_lint():
    assert lint_prompt("You are a helpful assistant.") == []
    assert any("timestamp" in i for i in lint_prompt("Now: 2026-05-09 07:35:25. Be brief."))
    assert any("UUID" in i for i in lint_prompt("session 123e4567-e89b-12d3-a456-426614174000"))
    assert any("date" in i for i in lint_prompt("Today is May 9, 2026."))
    assert any("not sorted" in i for i in lint_prompt("x", None, [{"name": "b"}, {"name": "a"}]))
    assert any("canonical" in i for i in lint_prompt("x", '[{"name": "a"}]'))
    assert lint_prompt("x", '[{"name":"a"},{"name":"b"}]', [{"name": "a"}, {"name": "b"}]) == []


def test_check_prefix_gate(eng, ws):
    """seed-000 passes the 80% engine-reuse bar; the timestamp variant fails and names 'system'."""
    from pathlib import Path

    import tools

    from app.agent.tasks import Task, gate_passes, load_task, run_task

    tasks = Path(__file__).resolve().parents[2] / "assets" / "tasks"
    task = load_task(tasks / "seed000.toml")
    agent = Agent(eng, Toolkit(tools.builtin_tools()),
                  limits=AgentLimits(max_tokens=24, call_max_tokens=64, follow_up=task.follow_up))
    report = run_task(agent, task)
    ok, verdict = gate_passes(report, 0.8, "engine")
    assert ok, verdict
    # the broken variant, shortened (two plain turns, one small tool: every call is a full prefill)
    broken = load_task(tasks / "seed000_timestamp.toml")
    assert broken.system_timestamp and broken.steps == task.steps
    short = Task(broken.name, tuple(s.__class__(s.user, "none") for s in broken.steps[:2]), True)
    agent = Agent(eng, Toolkit([tools.now]), limits=AgentLimits(max_steps=1, max_tokens=4), system_timestamp=True)
    report = run_task(agent, short)
    ok, verdict = gate_passes(report, 0.8, "engine")
    assert not ok and "segment 'system'" in verdict, verdict


def test_prewarm_is_an_engine_call_of_its_own_in_the_report(eng, ws):
    """The pre-warm is call 0 (kind prewarm) of the ledger; check-prefix prints reuse with it and without it."""
    import tools

    from app.agent.tasks import Step, Task, format_report, run_task

    agent = Agent(eng, Toolkit([tools.now, tools.calculate]), limits=AgentLimits(max_steps=1, max_tokens=4),
                  session_id="feedface0001")
    eng.clear_cache()
    task = Task("two", (Step("Hello.", "none"), Step("And now?", "none")))
    report = run_task(agent, task, prewarm=True)
    warm, first = report.calls[0], report.calls[1]
    static = agent.prompt.segments[1].end
    assert (warm.turn, warm.call, warm.stats.kind, warm.tool_choice) == (0, 0, "prewarm", "prewarm")
    assert warm.stats.prompt_tokens == static and warm.stats.cached_tokens == 0 and warm.stats.computed_tokens == static
    assert warm.session_id == "feedface0001" and first.stats.cached_tokens >= static // 16 * 16
    assert report.reuse < report.steady_reuse  # the pre-warm's computed tokens count against the total
    lines = "\n".join(format_report(task, report, 0.8, "engine"))
    assert f"engine reuse {report.reuse:.1%} including the pre-warm (call 0: {static} tokens computed)" in lines
    assert f"steady state (the turns' calls only, the pre-warmed prefix counted as cached): engine reuse {report.steady_reuse:.1%}" in lines
    agent.close()
