"""KvdeckApp: the console. Owns the ConsoleState, the loaded engine + agent and the workers.

Threads: the UI thread owns the state and every widget; the load worker, the turn worker and the
trim-ahead worker (`@work(thread=True)`) only post messages (app.tui.messages). The engine's
public calls are safe from any thread; the workers drive the agent, one at a time (`_agent_lock`),
the UI reads pool snapshots. After a finished turn the trim-ahead worker runs Agent.trim_ahead()
while the input is free again; a message sent meanwhile cancels it (the pages done stay cached)
and its turn starts as soon as the trim's ledger is in.
A 50 ms timer measures the event loop's lateness (the longest UI stall) while a turn runs.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.worker import get_current_worker

from app.events import Event
from app.tui.messages import (AgentEventReceived, CancelTurn, EngineLoaded, EngineLoadFailed, EngineLoadProgressed,
                              PoolSampled, ReloadEngine, SubmitPrompt, TelemetrySampled, TokensStreamed,
                              ToolConfirmationRequested, TurnEnded)
from app.tui.screens.help import HelpScreen
from app.tui.screens.main import MainScreen
from app.tui.services import Builder, ConsoleOptions, Loaded, SessionHooks, pump_events
from app.tui.state import ConsoleState
from app.tui.widgets.power import new_history, psutil_sample, record

THEMES = ("textual-dark", "textual-light", "ansi-dark", "ansi-light")
STALL_TICK_S = 0.05


class KvdeckApp(App):
    CSS_PATH = Path(__file__).with_name("kvdeck.tcss")
    TITLE = "kvdeck"
    BINDINGS = [
        Binding("f1", "help", "Help"),
        Binding("question_mark", "help", "Help", show=False),
        Binding("f2", "sessions", "Sessions"),
        Binding("f3", "inspector", "Cache"),
        Binding("f4", "settings", "Settings"),
        Binding("ctrl+t", "cycle_theme", "Theme", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, builder: Builder | None = None, options: ConsoleOptions = ConsoleOptions(), *,
                 state: ConsoleState | None = None, sampler: Callable[[], dict] | None = psutil_sample,
                 store=None, theme: str | None = None, telemetry_s: float = 1.0, telemetry=None,
                 history: list | None = None) -> None:
        super().__init__()
        self.builder = builder
        self.options = options
        self.state = state or ConsoleState()
        # `telemetry`: an app.telemetry Sampler (duck-typed) passed by the composition root; its
        # latest reading feeds the power panel and it measures each engine call's energy.
        self.telemetry_source = telemetry
        self.sampler = (lambda: telemetry.history.latest()) if telemetry is not None else sampler
        self.store = store
        self.telemetry = new_history()
        for s in history or ():  # recorded readings (a recorded session's sparklines)
            record(self.telemetry, s)
        self.telemetry_s = telemetry_s
        self.loaded: Loaded | None = None
        self.load_stage = ""
        self.load_fraction: float | None = None
        self.turn_started = 0.0
        self._cancel = threading.Event()
        self._agent_lock = threading.Lock()  # one worker drives the agent at a time (turn, trim-ahead)
        self.ahead_running = False  # a trim-ahead computation is in flight (the status line says so)
        self._last_tick = 0.0
        self.stall_max_s = 0.0  # longest event-loop lateness during the last turn
        if theme:
            self.theme = theme

    # ---- lifecycle ----------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.push_screen(MainScreen())
        if self.sampler is not None:
            self.set_interval(self.telemetry_s, self._sample)
            self._sample()
        self.set_interval(0.5, self._tick_status)
        self.set_interval(STALL_TICK_S, self._tick_stall)
        if self.builder is not None:
            self.load(self.options)

    def main(self) -> MainScreen | None:
        for s in self.screen_stack:
            if isinstance(s, MainScreen):
                return s
        return None

    def sync(self) -> None:
        m = self.main()
        if m is not None and m.is_mounted:
            m.sync()

    def _sample(self) -> None:
        try:
            sample = self.sampler()
        except Exception as e:  # a telemetry source must never take the console down
            sample = {"source": "none", "unavailable": f"telemetry failed: {type(e).__name__}: {e}"}
        if sample is not None:
            self.post_message(TelemetrySampled(sample))

    def _tick_status(self) -> None:
        m = self.main()
        if m is not None and m.is_mounted and (self.state.busy or self.load_stage or self.ahead_running):
            for w in m.query("#status"):
                w.update(m.status_text())
            if self.state.busy and self.loaded is not None:
                # engine.snapshot() is a cheap copy that never waits for the running prefill:
                # the gauge shows the call's locked pages while it runs.
                self.state.set_pool(self.loaded.engine.snapshot())
                from app.tui.widgets.pool import PoolPanel

                for w in m.query(PoolPanel):
                    w.sync()

    def _tick_stall(self) -> None:
        now = time.monotonic()
        if self.state.busy and self._last_tick:
            self.stall_max_s = max(self.stall_max_s, now - self._last_tick - STALL_TICK_S)
        self._last_tick = now

    # ---- workers ------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load")
    def load(self, options: ConsoleOptions) -> None:
        post = self.post_message
        t0 = time.monotonic()
        post(EngineLoadProgressed(f"{options.model} ({options.weights} weights, {options.kv} KV)", None))
        try:
            built = self.builder(options, lambda stage, frac: post(EngineLoadProgressed(stage, frac)))
            engine, agent = built[:2]
            self._guard(agent, options)
            hooks = built[2] if len(built) > 2 else SessionHooks()
            result = []
            if hooks.start is not None:
                post(EngineLoadProgressed("starting the session" + (", pre-warming the system + tools prefix"
                                                                   if options.prewarm else ""), None))
                result = hooks.start(agent)
            elif options.prewarm:
                post(EngineLoadProgressed("pre-warming the system + tools prefix", None))
                result = agent.prewarm()
            for ev in result if isinstance(result, (list, tuple)) else ():
                if isinstance(ev, Event):
                    post(AgentEventReceived(ev))
            post(PoolSampled(engine.snapshot(), tree=engine.tree()))
        except Exception as e:  # shown on screen; the console stays up to change settings
            post(EngineLoadFailed(f"{type(e).__name__}: {e}"))
            return
        post(EngineLoaded(Loaded(engine, agent, options, time.monotonic() - t0, hooks)))

    @work(thread=True, exclusive=True, group="turn")
    def run_turn(self, text: str) -> None:
        worker = get_current_worker()
        loaded = self.loaded
        with self._agent_lock:  # a trim-ahead in flight was cancelled by on_submit_prompt: its ledger first
            try:
                events = loaded.agent.run_turn(text, loaded.options.tool_choice if loaded.options.tools else "none")
                outcome = pump_events(events, self.post_message, loaded.engine, telemetry=self.telemetry_source,
                                      sink=loaded.hooks.on_event,
                                      cancelled=lambda: worker.is_cancelled or self._cancel.is_set())
            except Exception as e:  # a bad tool_choice or an engine error ends the turn, not the console
                self.post_message(TurnEnded("failed", f"{type(e).__name__}: {e}"))
                return
        self.post_message(TurnEnded("cancelled" if self._cancel.is_set() else outcome))

    @work(thread=True, group="ahead")
    def trim_ahead(self, loaded: Loaded) -> None:
        """After a finished turn: Agent.trim_ahead() (a trim the next turn would need, computed now).
        Not cancelled by the worker machinery, only through Agent.cancel(), so its ledger always lands."""
        ahead = getattr(loaded.agent, "trim_ahead", None)
        if ahead is None:
            return
        with self._agent_lock:
            self.ahead_running = True  # before the check: a submit from now on cancels it
            if self.loaded is not loaded or self.state.busy:
                self.ahead_running = False
                return  # reloaded, or the next turn came first
            try:
                pump_events(ahead(), self.post_message, loaded.engine, telemetry=self.telemetry_source,
                            sink=loaded.hooks.on_event)
            except Exception as e:  # the trim stands; the next call computes what is missing
                self.call_from_thread(self.state.note, "error", f"trim ahead failed: {type(e).__name__}: {e}")
            finally:
                self.ahead_running = False

    def _guard(self, agent, options: ConsoleOptions) -> None:
        """Make the agent ask before its side-effect tools run (ConfirmingExecutor)."""
        from app.tui.confirm import ConfirmingExecutor

        if getattr(agent, "executor", None) is not None and options.confirm_tools:
            agent.executor = ConfirmingExecutor(agent.executor, agent.toolkit, options.confirm_tools, self.ask_tool)

    def ask_tool(self, name: str, arguments) -> bool:
        """On the turn worker: show the question and wait for the answer (False when cancelled)."""

        worker = get_current_worker()
        answered = threading.Event()
        answer = {"yes": False}

        def done(yes: bool | None) -> None:
            answer["yes"] = bool(yes)
            answered.set()

        self.post_message(ToolConfirmationRequested(name, arguments, done))  # thread-safe, never blocks
        while not answered.wait(0.1):
            if self._cancel.is_set() or worker.is_cancelled:  # Esc, or the app is closing
                self.call_from_thread(self._drop_confirm)
                return False
        return answer["yes"]

    def on_tool_confirmation_requested(self, msg: ToolConfirmationRequested) -> None:
        from app.tui.confirm import ConfirmToolScreen

        if self._cancel.is_set():
            msg.done(False)
            return
        self.push_screen(ConfirmToolScreen(msg.name, msg.arguments), msg.done)

    def _drop_confirm(self) -> None:
        from app.tui.confirm import ConfirmToolScreen

        if isinstance(self.screen, ConfirmToolScreen):
            self.screen.dismiss(False)

    def cancel_turn(self) -> None:
        """Esc: stop the call in flight (Generation.cancel through the agent), keep the session."""
        self._cancel.set()
        cancel = getattr(getattr(self.loaded, "agent", None), "cancel", None)
        if cancel is not None:
            cancel()
        self.state.note("notice", "cancelling…")
        self.sync()

    def _stop_ahead(self, loaded: Loaded | None = None, wait_s: float = 0.0) -> None:
        """Cancel a trim-ahead in flight (its pages done stay cached); with wait_s, wait for its
        worker to give the agent back (closing a session)."""
        loaded = loaded or self.loaded
        if loaded is not None and self.ahead_running:
            cancel = getattr(loaded.agent, "cancel", None)
            if cancel is not None:
                cancel()
        if wait_s and self._agent_lock.acquire(timeout=wait_s):
            self._agent_lock.release()

    # ---- messages -----------------------------------------------------------------------------
    def on_submit_prompt(self, msg: SubmitPrompt) -> None:
        self._cancel.clear()
        self._stop_ahead()
        self.state.busy = True
        self.turn_started = time.monotonic()
        self.stall_max_s = 0.0
        self._last_tick = 0.0
        self.run_turn(msg.text)
        self.sync()

    def on_cancel_turn(self, _: CancelTurn) -> None:
        self.cancel_turn()

    def on_agent_event_received(self, msg: AgentEventReceived) -> None:
        self.state.apply(msg.event)
        self.sync()

    def on_tokens_streamed(self, msg: TokensStreamed) -> None:
        self.state.stream(msg.turn, msg.call, msg.text)
        self.sync()

    def on_pool_sampled(self, msg: PoolSampled) -> None:
        self.state.set_pool(msg.snapshot)
        if msg.tree is not None:
            self.state.tree = msg.tree
        for ev in msg.cache_events:
            self.state.cache_event(ev)
        self.sync()

    def on_turn_ended(self, msg: TurnEnded) -> None:
        self.state.busy = False
        self.state.call_prompt = 0
        if msg.outcome == "finished" and self.loaded is not None:
            self.trim_ahead(self.loaded)
        if msg.outcome == "cancelled":
            self.state.note("notice", "turn cancelled; the session continues")
        elif msg.error:
            self.state.note("error", msg.error)
        self.sync()

    def on_telemetry_sampled(self, msg: TelemetrySampled) -> None:
        record(self.telemetry, msg.sample)
        m = self.main()
        if m is not None and m.is_mounted:
            from app.tui.widgets.power import PowerPanel

            for w in m.query(PowerPanel):
                w.sync()

    def on_engine_load_progressed(self, msg: EngineLoadProgressed) -> None:
        self.load_stage, self.load_fraction = msg.stage, msg.fraction
        self.sync()

    def on_engine_loaded(self, msg: EngineLoaded) -> None:
        self.loaded = msg.loaded
        self.options = msg.loaded.options
        # The engine, tokenizer and grammars live as long as the session: keep them out of the
        # collector's full passes (a gen-2 pass over them is a UI stall).
        gc.collect()
        gc.freeze()
        self.load_stage = ""
        eng = msg.loaded.engine
        self.state.model = eng.config.model
        self.state.decode = lambda ids: eng.tokenizer.decode(list(ids), skip_special_tokens=False)
        self.state.note("notice", f"loaded {eng.config.model}: {eng.weight_format} weights, {eng.kv_format} KV, "
                                  f"{eng.backend} in {msg.loaded.load_s:.1f} s")
        self.sync()
        m = self.main()
        if m is not None:
            m.focus_input()

    def on_engine_load_failed(self, msg: EngineLoadFailed) -> None:
        self.load_stage = ""
        self.state.note("error", f"engine load failed: {msg.error}")
        self.notify(msg.error, title="engine load failed", severity="error", timeout=10)
        self.sync()

    def on_reload_engine(self, msg: ReloadEngine) -> None:
        if self.state.busy:
            self.notify("A turn is running: Esc cancels it first", severity="warning")
            return
        old, self.loaded = self.loaded, None
        self.close_session(old)
        self.state.note("notice", "reloading the engine with the new settings")
        self.load(msg.options)

    def close_session(self, loaded: Loaded | None) -> None:
        """End a loaded agent's session: the store's end hook, then the agent's pins and executor."""
        if loaded is None:
            return
        self._stop_ahead(loaded, wait_s=10.0)
        if loaded.hooks.end is not None:
            loaded.hooks.end(loaded.agent)
        close = getattr(loaded.agent, "close", None) or getattr(loaded.agent.session, "close", None)
        if close is not None:
            close()

    def on_unmount(self) -> None:
        self.close_session(self.loaded)
        self.loaded = None

    # ---- actions ------------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_cycle_theme(self) -> None:
        i = THEMES.index(self.theme) if self.theme in THEMES else -1
        self.theme = THEMES[(i + 1) % len(THEMES)]
        self.notify(f"theme {self.theme}")

    def action_inspector(self) -> None:
        from app.tui.screens.inspector import InspectorScreen

        if not isinstance(self.screen, InspectorScreen):
            self.push_screen(InspectorScreen())

    def action_settings(self) -> None:
        from app.tui.screens.settings import SettingsScreen

        if not isinstance(self.screen, SettingsScreen):
            self.push_screen(SettingsScreen(self.options))

    def action_sessions(self) -> None:
        from app.tui.screens.sessions import SessionsScreen

        if not isinstance(self.screen, SessionsScreen):
            self.push_screen(SessionsScreen())
