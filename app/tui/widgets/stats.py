"""Engine figures: the last call and the whole session (TTFT, prefill / decode tok/s, formats)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from app.tui.state import ConsoleState


def stats_table(state: ConsoleState) -> Table:
    t = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold", expand=False)
    t.add_column("")
    t.add_column("last", justify="right")
    t.add_column("session", justify="right")
    last = state.calls[-1] if state.calls else None
    tot = state.totals()

    def cell(fmt, value):
        return fmt.format(value) if last is not None else "—"

    t.add_row("call", last.label + (f" ({last.kind})" if last.kind != "generate" else "") if last else "—",
              f"{tot['calls']} call{'s' * (tot['calls'] != 1)}")
    t.add_row("TTFT", cell("{:.0f} ms", last.ttft_s * 1000 if last else 0), f"{tot['ttft_s'] * 1000:.0f} ms")
    t.add_row("prefill", cell("{:.0f} tok/s", last.prefill_tok_s if last else 0), f"{tot['prefill_tok_s']:.0f} tok/s")
    t.add_row("decode", cell("{:.1f} tok/s", last.decode_tok_s if last else 0), f"{tot['decode_tok_s']:.1f} tok/s")
    t.add_row("reuse", cell("{:.1f}%", last.reuse * 100 if last else 0), Text(f"{tot['reuse'] * 100:.1f}%", "bold"))
    t.add_row("generated", cell("{}", last.decode_tokens if last else 0), str(tot["decode_tokens"]))
    t.add_row("evicted", cell("{} pages", last.evicted_pages if last else 0), f"{tot['evicted_pages']} pages")
    t.add_row("finish", last.finish if last else "—", "")
    return t


def engine_line(state: ConsoleState) -> Text:
    last = state.calls[-1] if state.calls else None
    t = Text()
    t.append(state.model or "model ?", style="bold")
    if last is not None:
        threads = f" ×{last.threads}" if last.threads else ""
        t.append(f"\n{last.weight_format} · {last.kv_format} KV · {last.backend}{threads}")
    return t


class StatsPanel(Static):
    BORDER_TITLE = "engine"
    DEFAULT_CSS = "StatsPanel { height: auto; }"

    def __init__(self, state: ConsoleState, **kw) -> None:
        super().__init__(**kw)
        self.state = state
        self._seen = -1

    def on_mount(self) -> None:
        self.sync(force=True)

    def sync(self, force: bool = False) -> None:
        key = (len(self.state.calls), self.state.model)
        if key == self._seen and not force:
            return
        self._seen = key
        from rich.console import Group

        self.update(Group(engine_line(self.state), stats_table(self.state)))
