"""The main screen: transcript + prompt input | prompt chart | KV pool + evictions | engine | power.

Wide terminals (≥ 120×36) show every panel at once; smaller ones (80×24 over SSH) put the panels
in tabs (F5..F8 switch). The layout is recomposed when the size crosses that line; nothing is
lost because every panel renders from the app's ConsoleState.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets._tabbed_content import ContentTabs
from textual.widgets import Footer, Input, ProgressBar, Static, TabbedContent, TabPane

from app.tui.messages import SubmitPrompt
from app.tui.widgets.banner import PrefixBanner
from app.tui.widgets.pool import PoolPanel
from app.tui.widgets.power import PowerPanel
from app.tui.widgets.prompt_chart import PromptChart
from app.tui.widgets.stats import StatsPanel
from app.tui.widgets.transcript import Transcript

WIDE = (120, 36)  # columns, rows from which every panel is shown at once

TABS = (("chat", "Chat"), ("prompt", "Prompt"), ("pool", "Pool"), ("engine", "Engine"))


class MainScreen(Screen):
    BINDINGS = [
        Binding("escape", "cancel_turn", "Cancel turn", priority=True),
        Binding("f5", "tab('chat')", "Chat", show=False),
        Binding("f6", "tab('prompt')", "Prompt", show=False),
        Binding("f7", "tab('pool')", "Pool", show=False),
        Binding("f8", "tab('engine')", "Engine", show=False),
    ]

    compact: reactive[bool] = reactive(True, recompose=True)

    def __init__(self) -> None:
        super().__init__(id="main")
        self._tab = "chat"
        self._draft = ""

    # ---- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        app = self.app
        state = app.state
        yield Static(id="status")
        yield ProgressBar(id="progress", show_eta=False)
        yield PrefixBanner(state, id="banner")
        if self.compact:
            with TabbedContent(initial=self._tab, id="tabs"):
                with TabPane("Chat F5", id="chat"):
                    yield Transcript(state, id="transcript")
                    yield self._input()
                with TabPane("Prompt F6", id="prompt"):
                    yield PromptChart(state, id="chart", classes="panel")
                with TabPane("Pool F7", id="pool"):
                    yield PoolPanel(state, id="poolpanel", classes="panel")
                with TabPane("Engine F8", id="engine"):
                    with Horizontal(classes="row"):
                        yield StatsPanel(state, id="stats", classes="panel")
                        yield PowerPanel(app.telemetry, state, id="power", classes="panel")
        else:
            with Horizontal(id="wide"):
                with Vertical(id="left"):
                    yield Vertical(Transcript(state, id="transcript"), self._input(), id="chat", classes="panel")
                    with Horizontal(classes="row"):
                        yield StatsPanel(state, id="stats", classes="panel")
                        yield PowerPanel(app.telemetry, state, id="power", classes="panel")
                with Vertical(id="side"):
                    yield PromptChart(state, id="chart", classes="panel")
                    yield PoolPanel(state, id="poolpanel", classes="panel")
        yield Footer()

    def _input(self) -> Input:
        return Input(value=self._draft, placeholder="Message the agent — Enter sends, Esc cancels, F1 help",
                     id="prompt-input")

    def on_mount(self) -> None:
        for w in self.query("#chat"):
            w.border_title = "transcript"
        self._fit()
        self.sync()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        w, h = self.app.size
        compact = w < WIDE[0] or h < WIDE[1]
        if compact != self.compact:
            inp = self.query("#prompt-input")
            self._draft = inp.first().value if inp else self._draft
            self.compact = compact

    async def recompose(self) -> None:
        await super().recompose()
        for w in self.query("#chat"):
            w.border_title = "transcript"
        self.sync()
        self.focus_input()

    # ---- actions -------------------------------------------------------------------------
    def focus_input(self) -> None:
        for inp in self.query("#prompt-input"):
            inp.focus()

    def action_tab(self, tab: str) -> None:
        self._tab = tab
        for tabs in self.query(TabbedContent):
            # Drop focus first: a focused widget in the old pane would pull the tabs back to it.
            self.set_focus(None)
            tabs.active = tab
            if tab == "chat":
                self.call_after_refresh(self.focus_input)
            else:
                self.call_after_refresh(tabs.query_one(ContentTabs).focus)

    def action_cancel_turn(self) -> None:
        if self.app.state.busy:
            self.app.cancel_turn()
        else:
            self.focus_input()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.app.state.busy:
            self.app.notify("A turn is running: Esc cancels it", severity="warning")
            return
        if self.app.loaded is None:
            self.app.notify("No engine is loaded", severity="warning")
            return
        event.input.value = ""
        self.app.post_message(SubmitPrompt(text))

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._tab = event.pane.id or self._tab
        self.sync()

    # ---- rendering -------------------------------------------------------------------------
    def status_text(self) -> Text:
        app = self.app
        st = app.state
        t = Text()
        t.append(" kvdeck ", style="bold reverse")
        t.append(" ")
        if app.load_stage:
            t.append(f"loading: {app.load_stage}", style="yellow")
        elif app.loaded is None:
            t.append("viewing a recorded session (no engine)" if app.builder is None else "no engine",
                     style="italic")
        elif st.busy:
            since = time.monotonic() - app.turn_started if app.turn_started else 0.0
            what = f"prefilling {st.call_prompt} tokens" if st.call_prompt else "generating"
            t.append(f"turn {st.turn}: {what} ({since:.0f} s) — Esc cancels", style="yellow")
        elif getattr(app, "ahead_running", False) and st.call_prompt:
            t.append(f"trimming ahead: computing {st.call_prompt} kept tokens · sending cancels it", style="cyan")
        else:
            tot = st.totals()
            n = tot["calls"]
            t.append(f"{st.model} ready · {n} call{'s' * (n != 1)} · reuse {tot['reuse'] * 100:.1f}%", style="green")
        return t

    def sync(self) -> None:
        """Re-render every panel from the state (each skips work when its data did not move)."""
        app = self.app
        for w in self.query("#status"):
            w.update(self.status_text())
        for bar in self.query("#progress"):
            bar.display = bool(app.load_stage)
            bar.update(total=None if app.load_fraction is None else 1.0,
                       progress=app.load_fraction or 0.0)
        for w in self.query(PrefixBanner):
            w.sync()
        for w in self.query(Transcript):
            w.sync()
        for w in self.query(PromptChart):
            w.sync()
        for w in self.query(PoolPanel):
            w.sync()
        for w in self.query(StatsPanel):
            w.sync()
        for w in self.query(PowerPanel):
            w.sync()
        for inp in self.query("#prompt-input"):
            inp.disabled = app.loaded is None
