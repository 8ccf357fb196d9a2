"""The console on the real engine (SmolLM2-135M, a few tokens per turn), driven by Textual's Pilot."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
from textual.widgets import Static

from app.tui.app import KvdeckApp
from app.tui.screens.main import MainScreen
from app.tui.services import ConsoleOptions
from app.tui.widgets.prompt_chart import PromptChart
from tui_helpers import shown, wait_for

OPTS = ConsoleOptions(max_tokens=8, tool_choice="none")


async def _loaded(pilot, app):
    await wait_for(pilot, lambda: app.loaded is not None, timeout=120)
    await pilot.pause(0.2)


async def _send(pilot, text: str) -> None:
    await pilot.click("#prompt-input")
    inp = pilot.app.screen.query_one("#prompt-input")
    inp.value = text
    await pilot.press("enter")


@pytest.mark.anyio
async def test_a_message_shows_its_call_in_the_panels(builder):
    app = KvdeckApp(builder, OPTS, sampler=None)
    async with app.run_test(size=(160, 48)) as pilot:
        await _loaded(pilot, app)
        assert [c.kind for c in app.state.calls] == ["prewarm"], "the pre-warm is the first bar"
        await _send(pilot, "Say hello.")
        await wait_for(pilot, lambda: not app.state.busy and len(app.state.calls) == 2, timeout=120)
        await pilot.pause(0.3)
        call = app.state.calls[-1]
        assert call.cached > 0 and call.cached + call.computed == call.prompt
        table = shown(app.screen.query_one(PromptChart).query_one("#calls"))
        row = next(line for line in table.splitlines() if line.split()[:1] == ["1.1"])
        assert row.split()[1:4] == [str(call.prompt), str(call.cached), str(call.computed)]
        assert f"{call.reuse * 100:.0f}%" in row
        bars = shown(app.screen.query_one(PromptChart).query_one("#bars"))
        assert "1.1" in bars and "pre" in bars
        stats = shown(app.screen.query_one("#stats"))
        assert "TTFT" in stats and f"{call.ttft_s * 1000:.0f} ms" in stats
        pool = shown(app.screen.query_one("#poolpanel").query_one("#gauge"))
        assert f"{app.state.pool['used_pages']}/{app.state.pool['total_pages']} pages" in pool
        answer = [e for e in app.state.entries if e.kind == "answer"]
        assert answer and answer[-1].text.strip(), "the streamed answer is in the transcript"


@pytest.mark.anyio
async def test_escape_cancels_mid_prefill_and_the_session_continues(builder):
    app = KvdeckApp(builder, OPTS, sampler=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(pilot, app)
        long = " ".join(f"sensor{i} reads {i % 7} volts;" for i in range(400))  # ~2800 tokens
        await _send(pilot, long)
        await wait_for(pilot, lambda: app.state.call_prompt > 2000, timeout=30)
        await pilot.pause(0.3)  # inside the prefill
        await pilot.press("escape")
        took = await wait_for(pilot, lambda: not app.state.busy, timeout=10)
        assert took < 2.0, f"the turn ended {took:.1f} s after Esc"
        assert any("cancelled" in e.text for e in app.state.entries)
        assert not app.state.calls[-1:] or app.state.calls[-1].kind == "prewarm" or \
            app.state.calls[-1].finish == "cancelled"
        n = len(app.state.calls)
        await _send(pilot, "Say hi.")
        await wait_for(pilot, lambda: not app.state.busy and len(app.state.calls) > n, timeout=120)
        assert app.state.calls[-1].finish in ("stop", "length")
        assert app.state.calls[-1].cached > 0, "the session's prefix is still cached after the cancel"


@pytest.mark.anyio
async def test_the_ui_keeps_running_during_a_long_prefill(builder):
    """The event loop's longest stall while a ~3000-token prompt is prefilled: at most 100 ms more
    than twice what the operating system makes any process wait meanwhile. A separate process
    ticking every 10 ms measures that wait: on a quiet machine it is a few ms (the bound is then
    ~0.1 s); with more runnable threads than cores every thread waits for its share, the UI thread
    included. Measured on this 2-core box: 14 ms over a 2994-token prefill (11.6 s) at a load of
    0.5 per core; 320-630 ms while other jobs loaded it to 2-5 per core. A prefill run on the
    event loop (or holding the GIL) stalls it for the whole prefill, seconds."""
    app = KvdeckApp(builder, OPTS, sampler=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(pilot, app)
        long = " ".join(f"pump{i} pressure {i % 9} bar;" for i in range(340))  # ~3000 tokens
        gc.collect()  # the garbage of the earlier tests in this process is not the console's
        ticker = subprocess.Popen([sys.executable, "-c", _TICKER], stdout=subprocess.PIPE, text=True)
        try:
            await _send(pilot, long)
            await wait_for(pilot, lambda: not app.state.busy, timeout=180)
        finally:
            ticker.terminate()
            os_stall = float(ticker.communicate(timeout=30)[0] or "nan")
        call = app.state.calls[-1]
        assert call.computed > 2500, f"the prefill computed {call.computed} tokens"
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
        print(f"\nlongest UI stall during a {call.computed}-token prefill ({call.prefill_s:.1f} s): "
              f"{app.stall_max_s * 1000:.0f} ms; another process's {os_stall * 1000:.0f} ms "
              f"(load {per_core:.1f} per core)")
        assert app.stall_max_s < 0.1 + 2 * os_stall


# Another process's longest lateness of a 10 ms sleep, printed when it is terminated.
_TICKER = """
import signal, sys, time
worst, last = 0.0, time.monotonic()
def report(*_):
    print(worst, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, report)
while True:
    time.sleep(0.01)
    now = time.monotonic()
    worst, last = max(worst, now - last - 0.01), now
"""


@pytest.mark.anyio
async def test_layout_switches_between_tabs_and_panels(builder):
    app = KvdeckApp(builder, OPTS, sampler=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(pilot, app)
        screen = app.screen
        assert isinstance(screen, MainScreen) and screen.compact
        await pilot.press("f6")
        await pilot.pause(0.2)
        assert screen.query_one("#tabs").active == "prompt"
        await pilot.resize_terminal(160, 48)
        await wait_for(pilot, lambda: not screen.compact and screen.query("#side"), timeout=5)
        await pilot.press("f1")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.press("f3")
        await pilot.pause(0.3)
        assert type(app.screen).__name__ == "InspectorScreen"
        assert "pin 1" in shown(app.screen.query_one("#tree")), "the pre-warmed prefix is pinned"


@pytest.mark.anyio
async def test_an_outbox_tool_asks_first_and_a_refusal_goes_back_to_the_model(builder):
    from app.tui.confirm import DECLINED, ConfirmToolScreen

    app = KvdeckApp(builder, ConsoleOptions(max_tokens=8, tool_choice="add_reminder"), sampler=None)
    async with app.run_test(size=(100, 30)) as pilot:
        await _loaded(pilot, app)
        await _send(pilot, "Remind me to check the fan.")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmToolScreen) or not app.state.busy, timeout=120)
        assert isinstance(app.screen, ConfirmToolScreen), [(e.kind, e.text[:200]) for e in app.state.entries]
        # composed and laid out (it mounts after the push; a 0x0 widget draws nothing yet)
        await wait_for(pilot, lambda: any(w.size.area for w in app.screen.query(Static)), timeout=10)
        assert "add_reminder" in shown(app.screen.query_one(Static))
        await pilot.press("n")
        await wait_for(pilot, lambda: not app.state.busy, timeout=120)
        tools = [e.tool for e in app.state.entries if e.kind == "tool"]
        assert tools and tools[-1].name == "add_reminder"
        assert tools[-1].ok is False and tools[-1].result == DECLINED


@pytest.mark.anyio
async def test_settings_validate_and_reload_the_engine(builder):
    from app.tui.screens.settings import SettingsScreen

    app = KvdeckApp(builder, OPTS, sampler=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(pilot, app)
        first = app.loaded.agent
        await pilot.press("f4")
        await pilot.pause(0.3)
        assert isinstance(app.screen, SettingsScreen)
        app.screen.query_one("#kv_pages").value = "many"
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert "kv_pages" in shown(app.screen.query_one("#error")), "a bad field is named"
        app.screen.query_one("#kv_pages").value = "0"
        app.screen.query_one("#max_tokens").value = "5"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.loaded is not None and app.loaded.agent is not first, timeout=120)
        assert app.options.max_tokens == 5 and app.loaded.agent.limits.max_tokens == 5
        assert any("reloading" in e.text for e in app.state.entries)


@pytest.mark.anyio
async def test_a_trim_ahead_runs_while_the_input_is_free_and_a_message_cancels_it(shared_engine, tmp_path):
    """Two ~1,030-token messages under a 2,600-token budget: after the second reply the console trims
    ahead (turn 1 dropped, the kept history computed into the cache) with the input free; a message
    sent meanwhile cancels it, its ledger row lands first and the turn runs."""
    import tools
    from app.agent import Agent, AgentLimits, Toolkit
    from app.agent.budget import BudgetPolicy

    def build(opts, progress):
        tools.configure(workspace=str(tmp_path), notes_dir=None)
        return shared_engine, Agent(shared_engine, Toolkit([]), limits=AgentLimits(max_tokens=opts.max_tokens),
                                    budget=BudgetPolicy(max_context=2600, ahead=True))

    app = KvdeckApp(build, OPTS.with_(tools=False), sampler=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await _loaded(pilot, app)
        for k in range(2):
            await _send(pilot, " ".join(f"valve{k}{i} at {i % 5} mm;" for i in range(110)))
            await wait_for(pilot, lambda: not app.state.busy and app.state.calls[-1].kind == "generate",
                           timeout=180)
        await wait_for(pilot, lambda: app.ahead_running and app.state.call_prompt > 0, timeout=30)
        status = shown(app.screen.query_one("#status"))
        assert "trimming ahead" in status and "sending cancels it" in status
        n = len(app.state.calls)
        await _send(pilot, "Short one.")  # the input is free: the message is taken, not refused
        await wait_for(pilot, lambda: not app.state.busy and len(app.state.calls) == n + 2, timeout=120)
        trim, reply = app.state.calls[-2:]
        assert trim.kind == "trim" and trim.finish in ("cancelled", "stop")
        assert trim.cached + trim.computed <= trim.prompt and trim.decode_tokens == 0
        assert reply.kind == "generate" and reply.turn == 3 and reply.finish in ("stop", "length")
        assert reply.cached >= trim.cached + trim.computed - 16, "the trim's pages serve the next call"
        notes = " ".join(e.text for e in app.state.entries if e.kind == "notice")
        assert "context trimmed ahead of the next turn" in notes
        stats = shown(app.screen.query_one("#stats")) if app.screen.query("#stats") else ""
        assert "(trim)" not in stats  # the last call shown is the reply
