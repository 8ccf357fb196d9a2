"""The prompt of each engine call, stacked: cached / new (computed) / recomputed (waste).

One bar per engine call (the pre-warm included), the most recent that fit, with the reuse %.
The bars are drawn cell by cell with Rich text in a Static: textual-plotext (which works with
Textual 8) draws horizontal stacked bars with half-block rows that do not line up with one label
per call, and its vertical bars give ~100 tokens per row, where a call's ~50 new tokens vanish.
Here one cell is prompt_max / width tokens and any non-zero segment gets at least one cell.
The table under the bars gives each call's figures.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from app.tui.state import CallRow, ConsoleState

COLORS = ("green", "blue", "red")  # cached, new, recomputed (ANSI names: readable in 16 colours)


def cells(values: list[int], scale: float) -> list[int]:
    """Cells per segment (cached, new, recomputed) at `scale` tokens per cell, summing to the
    whole bar's cells; the new and recomputed segments get at least one cell when non-zero."""
    total = max(1, round(sum(values) / scale))
    small = [max(1, round(v / scale)) if v > 0 else 0 for v in values[1:]]
    first = max(0, total - sum(small)) if values[0] > 0 else 0
    return [first, *small]


def bars(rows: list[CallRow], width: int) -> Text:
    """One line per call: label, reuse %, the stacked bar, the prompt tokens."""
    t = Text()
    if not rows:
        return t
    biggest = max(r.prompt for r in rows) or 1
    bar_w = max(8, width - 21)
    scale = biggest / bar_w
    for r in rows:
        t.append(f"{r.label:>5} {r.reuse * 100:3.0f}% ", style="bold" if r.kind == "generate" else "dim")
        n = cells([r.cached, r.fresh, r.waste], scale)
        for k, colour in zip(n, COLORS):
            t.append(" " * k, style=f"on {colour}")  # background cells: exact in terminals and SVG
        t.append(" " * max(0, bar_w - sum(n)))
        t.append(f" {r.prompt:>5}\n")
    t.rstrip()
    return t


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
    PromptChart #bars { height: auto; max-height: 1fr; margin: 0 0 1 0; }
    PromptChart #calls { height: auto; }
    """

    def __init__(self, state: ConsoleState, window: int = 12, table_rows: int = 6, **kw) -> None:
        super().__init__(**kw)
        self.state = state
        self.window = window
        self.table_rows = table_rows
        self._seen: tuple = ()

    def compose(self) -> ComposeResult:
        yield Static(id="bars")
        yield Static(id="calls")

    def on_mount(self) -> None:
        self.sync(force=True)

    def on_resize(self) -> None:
        self.sync(force=True)

    def sync(self, force: bool = False) -> None:
        box = self.query_one("#bars", Static)
        # the rows the panel has: less its border, the table (header + rows + total) and a gap
        fit = self.size.height - 2 - (min(self.table_rows, len(self.state.calls)) + 2) - 1
        window = max(1, min(self.window, fit)) if self.size.height else self.window
        key = (len(self.state.calls), window, box.size.width)
        if not force and key == self._seen:
            return
        self._seen = key
        rows = self.state.calls[-window:]
        tot = self.state.totals()
        self.border_title = (f"prompt per engine call · session reuse {tot['reuse'] * 100:.1f}%" if rows
                             else "prompt per engine call · no calls yet")
        box.update(bars(rows, box.size.width or 60) if rows else Text("no engine calls yet", style="italic"))
        self.query_one("#calls", Static).update(call_table(self.state.calls[-self.table_rows:], tot))
