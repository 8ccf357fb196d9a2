"""The KV pool: a segmented gauge (pinned / locked / evictable / other used / free), bytes,
per-owner shares, a sparkline of used pages, and the eviction log."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Sparkline, Static

from app.tui.state import ConsoleState

SEGMENTS = (("pinned", "magenta"), ("locked", "cyan"), ("evictable", "yellow"), ("used", "blue"),
            ("free", "bright_black"))


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def pool_parts(snap: dict) -> dict[str, int]:
    pinned, locked, evict = (int(snap.get(k, 0)) for k in ("pinned_pages", "locked_pages", "evictable_pages"))
    used = int(snap.get("used_pages", 0))
    return {"pinned": pinned, "locked": locked, "evictable": evict,
            "used": max(0, used - pinned - locked - evict), "free": int(snap.get("free_pages", 0))}


def gauge(snap: dict, width: int) -> Text:
    """One line of `width` cells, each segment proportional to its pages (at least 1 cell if any)."""
    parts = pool_parts(snap)
    total = max(1, int(snap.get("total_pages", 0)) or sum(parts.values()))
    t = Text()
    cells = {k: (round(v * width / total) if v else 0) for k, v in parts.items()}
    for k in cells:
        if parts[k] and not cells[k]:
            cells[k] = 1
    cells["free"] = max(0, width - sum(v for k, v in cells.items() if k != "free"))
    for name, colour in SEGMENTS:
        t.append(" " * cells[name], style=f"on {colour}")  # background cells line up exactly
    return t


def legend(snap: dict) -> Text:
    parts = pool_parts(snap)
    page_bytes = int(snap.get("block", 16)) * int(snap.get("bytes_per_token", 0))
    t = Text()
    for name, colour in SEGMENTS:
        t.append("■", style=colour)
        t.append(f" {name} {parts[name]}  ")
    total = int(snap.get("total_pages", 0))
    used = int(snap.get("used_pages", 0))
    t.append(f"\n{used}/{total} pages · {fmt_bytes(used * page_bytes)} of {fmt_bytes(total * page_bytes)} · "
             f"pinned {fmt_bytes(parts['pinned'] * page_bytes)} · {snap.get('block', '?')} tok/page")
    return t


class PoolPanel(Vertical):
    BORDER_TITLE = "KV pool · evictions"
    DEFAULT_CSS = """
    PoolPanel { height: 1fr; }
    PoolPanel #gauge { height: auto; }
    PoolPanel Sparkline { height: 2; margin: 0 0 1 0; }
    PoolPanel .label { height: 1; color: $text-muted; }
    PoolPanel DataTable { height: 1fr; min-height: 4; }
    """

    def __init__(self, state: ConsoleState, **kw) -> None:
        super().__init__(**kw)
        self.state = state
        self._seen = (-1, -1)

    def compose(self) -> ComposeResult:
        yield Static(id="gauge")
        yield Static("used pages", id="usedlabel", classes="label")
        yield Sparkline([], id="used")
        table = DataTable(id="evictions", cursor_type="row", zebra_stripes=False)
        table.add_columns("time", "pages", "at", "prefix", "owner", "reason")
        yield table

    def on_mount(self) -> None:
        self.sync(force=True)

    def on_resize(self) -> None:
        self.sync(force=True)

    def owners(self) -> str:
        """Pages per owner (engine session) in the radix tree the state last read."""
        shares: dict[int, int] = {}
        for n in self.state.tree:
            shares[n.get("owner", 0)] = shares.get(n.get("owner", 0), 0) + len(n.get("pages", ()))
        return " · ".join(f"s{o} {p}p" for o, p in sorted(shares.items()))

    def sync(self, force: bool = False) -> None:
        st = self.state
        key = (len(st.pool_history), len(st.evictions) and id(st.evictions[0]))
        if key == self._seen and not force:
            return
        self._seen = key
        snap = st.pool
        width = max(10, self.size.width - 2)
        g = self.query_one("#gauge", Static)
        if not snap:
            g.update(Text("KV pool: no snapshot yet (the engine is loading)", style="italic"))
        else:
            t = gauge(snap, width)
            t.append("\n")
            t.append(legend(snap))
            if st.tree:
                t.append(f"\nper session: {self.owners()}")
            if st.dropped_events:
                t.append(f"\n{st.dropped_events} cache events lost to a full ring", style="red")
            g.update(t)
        hist = list(st.pool_history)
        if hist:
            self.query_one("#usedlabel", Static).update(f"used pages over {len(hist)} snapshots: {min(hist)}–{max(hist)}")
        self.query_one(Sparkline).data = hist or [0]
        table = self.query_one(DataTable)
        table.clear()
        if not st.evictions:
            table.add_row("—", "", "", "no evictions yet", "", "")
        for ev in list(st.evictions)[:50]:
            table.add_row(time.strftime("%H:%M:%S", time.localtime(ev.t_wall)), str(ev.pages), str(ev.at),
                          ev.head_text[:24] or "?", f"s{ev.owner}", ev.reason)
