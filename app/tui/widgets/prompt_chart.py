"""The prompt of each engine call, stacked: cached / new (computed) / recomputed (waste).

One bar per engine call (the pre-warm included), the last `window` calls, drawn with
textual-plotext's stacked bar; the table under it gives each bar's figures and reuse %.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from app.tui.state import CallRow, ConsoleState

COLORS = ("green", "blue", "red")  # cached, new, recomputed: plotext colour names (16-colour safe)


def call_table(rows: list[CallRow], totals: dict | None = None) -> Table:
    t = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold", expand=False)
    for name, style in (("call", ""), ("prompt", ""), ("■ cached", "green"), ("computed", ""), ("■ new", "blue"),
                        ("■ recomp", "red"), ("reuse", "")):
        t.add_column(Text(name, style=style or "bold"), justify="right")
    for r in rows:
        t.add_row(r.label, str(r.prompt), str(r.cached), str(r.computed), str(r.new), str(r.waste),
                  f"{r.reuse * 100:.0f}%")
    if totals and totals["calls"]:
        t.add_row(Text("all", "bold"), str(totals["prompt"]), Text(str(totals["cached"]), "bold"),
                  str(totals["computed"]), str(totals["new"]), str(totals["waste"]),
                  Text(f"{totals['reuse'] * 100:.1f}%", "bold"))
    return t


class PromptChart(Vertical):
    BORDER_TITLE = "prompt per engine call"
    DEFAULT_CSS = """
    PromptChart { height: 1fr; }
    PromptChart PlotextPlot { height: 1fr; min-height: 8; }
    PromptChart #calls { height: auto; max-height: 9; }
    """

    def __init__(self, state: ConsoleState, window: int = 10, **kw) -> None:
        super().__init__(**kw)
        self.state = state
        self.window = window
        self.table_rows = 4
        self._seen = -1

    def compose(self) -> ComposeResult:
        yield PlotextPlot(id="plot")
        yield Static(id="calls")

    def on_mount(self) -> None:
        self.sync(force=True)

    def sync(self, force: bool = False) -> None:
        rows = self.state.calls[-self.window:]
        if not force and len(self.state.calls) == self._seen:
            return
        self._seen = len(self.state.calls)
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        tot = self.state.totals()
        self.border_title = (f"prompt per engine call · session reuse {tot['reuse'] * 100:.1f}%" if rows
                             else "prompt per engine call · no calls yet")
        if rows:
            # Horizontal bars: the panel's width gives the finer token resolution; the oldest call on top.
            top = max(self.window, len(rows))
            pos = [top - i for i in range(len(rows))]
            plt.stacked_bar(pos, [[r.cached for r in rows], [r.fresh for r in rows], [r.waste for r in rows]],
                            color=list(COLORS), width=0.6, orientation="horizontal")
            plt.yticks(pos, [f"{r.label} {r.reuse * 100:3.0f}%" for r in rows])
            plt.ylim(0.4, top + 0.6)
            plt.xlim(0, max(r.prompt for r in rows) * 1.02)
            plt.xfrequency(3)
        plot.refresh()
        self.query_one("#calls", Static).update(call_table(rows[-self.table_rows:], tot))
