"""Two stored sessions' ledgers side by side: per-call bars and tables, and the seed-000 summary
(computed tokens and time, A → B, with the ratio). Esc goes back."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.tui.state import CallRow
from app.tui.widgets.prompt_chart import bars, call_table


def summary(a: list[CallRow], b: list[CallRow]) -> Table:
    """The seed-000 table: what B changed against A, per figure, with B/A."""
    t = Table(box=None, padding=(0, 2), header_style="bold")
    for name in ("", "A", "B", "B / A"):
        t.add_column(name, justify="right")

    def row(name: str, fa: float, fb: float, fmt: str) -> None:
        ratio = f"{fb / fa:.2f}×" if fa else "—"
        t.add_row(name, fmt.format(fa), fmt.format(fb), ratio)

    for name, key, fmt in (("engine calls", lambda r: 1, "{:.0f}"), ("prompt tokens", lambda r: r.prompt, "{:.0f}"),
                           ("cached tokens", lambda r: r.cached, "{:.0f}"),
                           ("computed tokens", lambda r: r.computed, "{:.0f}"),
                           ("prefill s", lambda r: r.prefill_s, "{:.2f}"),
                           ("decode s", lambda r: r.decode_s, "{:.2f}"),
                           ("engine s", lambda r: r.prefill_s + r.decode_s, "{:.2f}")):
        row(name, sum(key(r) for r in a), sum(key(r) for r in b), fmt)
    pa, pb = sum(r.prompt for r in a), sum(r.prompt for r in b)
    t.add_row("reuse", f"{sum(r.cached for r in a) / pa * 100 if pa else 0:.1f}%",
              f"{sum(r.cached for r in b) / pb * 100 if pb else 0:.1f}%", "")
    return t


class CompareScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]
    DEFAULT_CSS = """
    CompareScreen #sides { height: 1fr; }
    CompareScreen .side { width: 1fr; border: round $primary 60%; padding: 0 1; }
    CompareScreen #summary { height: auto; border: round $accent 60%; padding: 0 1; }
    """

    def __init__(self, a: str, b: str) -> None:
        super().__init__()
        self.a, self.b = a, b

    def compose(self) -> ComposeResult:
        with Horizontal(id="sides"):
            yield VerticalScroll(Static(id="a"), classes="side")
            yield VerticalScroll(Static(id="b"), classes="side")
        yield Static(id="summary")
        yield Footer()

    def on_mount(self) -> None:
        from app.tui.screens.sessions import ledger_rows

        store = self.app.store
        rows = {}
        for key, sid in (("a", self.a), ("b", self.b)):
            calls = ledger_rows(store, sid)
            rows[key] = calls
            box = self.query_one(f"#{key}", Static)
            box.parent.border_title = f"{key.upper()}: session {store.short(sid)}"
            width = max(30, box.parent.size.width - 4)
            t = Text()
            t.append(bars(calls[-16:], width))
            box.update(t if calls else Text("no engine calls stored", style="italic"))
        self.query_one("#summary", Static).update(summary(rows["a"], rows["b"]))
        for key in ("a", "b"):
            self.query_one(f"#{key}", Static).parent.mount(Static(call_table(rows[key][-16:], None)))
