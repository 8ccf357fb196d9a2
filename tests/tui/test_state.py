"""The console's model without Textual: a recorded session folded into ConsoleState, the turn
pump's coalescing and cancel, and the recording round trip."""

from __future__ import annotations

from app import events as E
from app.engine.types import CallStats
from app.tui import recording
from app.tui.messages import AgentEventReceived, TokensStreamed
from app.tui.services import pump_events
from app.tui.state import ConsoleState
from app.tui.widgets.prompt_chart import bars, cells


def test_recorded_session_fills_every_panel(recorded):
    st = recording.replay_into(ConsoleState(), recorded)
    kinds = [c.kind for c in st.calls]
    assert kinds[0] == "prewarm" and kinds.count("prewarm") == 1
    for c in st.calls:
        assert c.cached + c.computed == c.prompt
        assert c.fresh + c.waste == c.computed
    first = st.calls[1]
    assert first.cached >= 900, "the pre-warmed system + tools prefix serves the first call"
    assert st.evictions and all(e.pages > 0 and e.head_text for e in st.evictions)
    assert st.banner is not None and st.banner.segment == "system"
    tools = [e for e in st.entries if e.kind == "tool"]
    assert tools and tools[0].tool.name == "calculate" and tools[0].tool.ok
    assert [e.kind for e in st.entries].count("user") == 3
    assert st.pool["total_pages"] == 156 and st.tree


def test_totals_are_the_sum_of_the_calls(recorded):
    st = recording.replay_into(ConsoleState(), recorded)
    tot = st.totals()
    assert tot["prompt"] == sum(c.prompt for c in st.calls)
    assert tot["cached"] == sum(c.cached for c in st.calls)
    assert abs(tot["reuse"] - tot["cached"] / tot["prompt"]) < 1e-12


def test_recording_round_trip(tmp_path, recorded):
    path = tmp_path / "s.jsonl"
    recording.save(path, recorded)
    again = recording.load(path)
    assert len(again) == len(recorded)
    a = [x for x in recorded if isinstance(x, E.EngineCallFinished)]
    b = [x for x in again if isinstance(x, E.EngineCallFinished)]
    assert a == b


def test_recording_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"event": "TurnStarted", "fields": {"turn": 1, "user_text": "x", "tool_choice": "auto"}}\n'
                    '{"event": "NoSuchEvent", "fields": {}}\n')
    try:
        recording.load(path)
    except ValueError as e:
        assert "bad.jsonl:2" in str(e) and "NoSuchEvent" in str(e)
    else:
        raise AssertionError("an unknown event must be refused")


def test_bar_cells_sum_to_the_bar_and_keep_small_segments():
    assert cells([992, 53, 0], 992 / 40) == [40, 2, 0]  # 1045 tokens at 24.8 per cell: 42 cells
    assert sum(cells([1000, 3, 1], 10)) == 100
    assert cells([0, 992, 0], 10)[0] == 0


def test_bars_one_line_per_call(recorded):
    st = recording.replay_into(ConsoleState(), recorded)
    lines = bars(st.calls, 70).plain.splitlines()
    assert len(lines) == len(st.calls)
    assert lines[0].split()[0] == "pre" and all(len(line) <= 70 for line in lines)


def _delta(text, call=1):
    return E.TokenDelta(1, call, text)


def test_pump_coalesces_token_deltas():
    clock = iter([0.0] + [0.001 * i for i in range(1, 200)])
    posted = []
    events = [E.TurnStarted(1, "hi", "none")] + [_delta(f"t{i} ") for i in range(100)] + [
        E.TurnFinished(1, "done", 1, 1, 0)]
    outcome = pump_events(events, posted.append, interval=0.05, clock=lambda: next(clock))
    assert outcome == "finished"
    streamed = [m for m in posted if isinstance(m, TokensStreamed)]
    assert 1 < len(streamed) <= 3, "100 deltas in ~0.1 s arrive as a few coalesced messages"
    assert "".join(m.text for m in streamed) == "".join(f"t{i} " for i in range(100))
    assert isinstance(posted[-1], AgentEventReceived) and isinstance(posted[-1].event, E.TurnFinished)


def test_pump_stops_when_cancelled_and_closes_the_turn():
    closed = []

    def turn():
        try:
            yield E.TurnStarted(1, "hi", "none")
            for i in range(1000):
                yield _delta("x")
        finally:
            closed.append(True)

    n = {"k": 0}

    def cancelled():
        n["k"] += 1
        return n["k"] > 5

    posted = []
    assert pump_events(turn(), posted.append, cancelled=cancelled) == "cancelled"
    assert closed == [True]


def test_cancelled_call_is_reported():
    st = ConsoleState()
    stats = CallStats(prompt_tokens=3000, cached_tokens=0, computed_tokens=3000, new_tokens=3000, waste_tokens=0,
                      reuse=0.0, ttft_s=0.0, prefill_s=1.0, decode_s=0.0, decode_tokens=0, decode_tok_s=0.0,
                      finish_reason="cancelled", weight_format="nvfp4", kv_format="f32", backend="cpu",
                      kv_used_pages=0, kv_pinned_pages=0, kv_free_pages=0, evicted_pages=0)
    st.apply(E.TurnStarted(1, "long", "none"))
    st.apply(E.EngineCallFinished(1, 1, stats, 0, 0, "none"))
    assert st.calls[-1].finish == "cancelled"
    assert any("cancelled" in e.text for e in st.entries if e.kind == "error")


def test_a_trim_is_a_note_not_a_prefix_break_banner():
    st = ConsoleState()
    stats = CallStats(prompt_tokens=4899, cached_tokens=1008, computed_tokens=3891, new_tokens=68, waste_tokens=3823,
                      reuse=1008 / 4899, ttft_s=19.7, prefill_s=19.6, decode_s=0.1, decode_tokens=2, decode_tok_s=20.0,
                      finish_reason="stop", weight_format="nvfp4", kv_format="f32", backend="cpu",
                      kv_used_pages=0, kv_pinned_pages=0, kv_free_pages=0, evicted_pages=0)
    st.apply(E.TurnStarted(127, "next", "auto"))
    st.apply(E.PrefixBreak(127, 1, "trimmed", 1008, "history", 4899, 1008, "", "old", "new"))
    st.apply(E.EngineCallFinished(127, 1, stats, 1008, 2, "auto", context_budget=8192, context_used=4901,
                                  trimmed_tokens=3297, trim_recomputed_tokens=3823))
    assert st.banner is None, "a trim is not a cache killer"
    note = [e.text for e in st.entries if e.kind == "notice"]
    assert note and "3297" in note[0] and "3823" in note[0] and "8192" in note[0]
    # A real break still raises the banner.
    st.apply(E.PrefixBreak(128, 1, "prompt changed", 97, "system", 1312, 96, "", "a", "b"))
    assert st.banner is not None and st.banner.segment == "system"
