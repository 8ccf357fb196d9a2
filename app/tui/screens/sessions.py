"""F2: stored sessions (app.store, passed in by the composition root) — list, search, open,
continue, compare, export, delete.

Keys: type to search (Enter runs it, empty lists all), ↓ to the list, Enter opens, c continues
in the console's agent, m marks one for comparing and p compares the marked one with the
highlighted one, e exports JSON, d twice deletes, Esc goes back.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from app.tui.state import CallRow
from app.tui.widgets.prompt_chart import bars


def ledger_rows(store, sid: str) -> list[CallRow]:
    """The stored engine calls of a session as CallRows (the pre-warm included)."""
    rows = []
    for r in store.rows("engine_calls", sid):
        st = SimpleNamespace(**r)
        rows.append(CallRow.from_stats(r["turn"], r["call"], st, r.get("tool_choice") or ""))
    return rows


def session_text(store, sid: str, width: int) -> Text:
    s = store.db["sessions"].get(sid)
    calls = ledger_rows(store, sid)
    t = Text()
    t.append(f"session {store.short(sid)}  {s.get('title') or ''}\n", style="bold")
    prompt = sum(c.prompt for c in calls)
    cached = sum(c.cached for c in calls)
    t.append(f"{len(calls)} engine calls · {prompt} prompt tokens · {cached} cached "
             f"({cached / prompt * 100 if prompt else 0:.1f}% reuse)\n\n")
    t.append(bars(calls[-12:], width))
    t.append("\n\n")
    for m in store.rows("messages", sid):
        if m["role"] in ("system", "tools"):
            continue
        t.append(f"{m['role']:>9} ", style="bold")
        t.append(" ".join(str(m["content"]).split())[:300] + "\n")
    return t


class SessionsScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("c", "continue_session", "Continue"),
        Binding("m", "mark", "Mark"),
        Binding("p", "compare", "Compare with mark"),
        Binding("e", "export", "Export"),
        Binding("d", "delete", "Delete (twice)"),
    ]
    DEFAULT_CSS = """
    SessionsScreen #cols { height: 1fr; }
    SessionsScreen DataTable { width: 3fr; }
    SessionsScreen #detail { width: 2fr; border: round $primary 60%; padding: 0 1; }
    SessionsScreen #note { height: 1; background: $boost; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.marked = ""
        self._armed = ""

    def compose(self) -> ComposeResult:
        yield Static(id="note")
        yield Input(placeholder="search messages and tool results (Enter) — empty: every session", id="search")
        with Horizontal(id="cols"):
            table = DataTable(id="list", cursor_type="row")
            table.add_columns("id", "started", "title", "turns", "calls", "status")
            yield table
            with VerticalScroll(id="detail") as d:
                d.border_title = "session"
                yield Static(id="sessiontext")
        yield Footer()

    @property
    def store(self):
        return self.app.store

    def on_mount(self) -> None:
        if self.store is None:
            self.note("no sessions database: the console was started without a store (--no-store)")
            return
        self.fill(self.store.list_sessions(200))
        self.query_one(DataTable).focus()

    def note(self, text: str) -> None:
        self.query_one("#note", Static).update(Text(" " + text))

    def fill(self, sessions: list[dict], snippets: dict | None = None) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for s in sessions:
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.get("created") or 0))
            title = (snippets or {}).get(s["id"]) or s.get("title") or ""
            table.add_row(self.store.short(s["id"]), started, title[:40], str(s.get("turns", "")),
                          str(s.get("calls", "")), s.get("status") or "", key=s["id"])
        self.note(f"{len(sessions)} sessions in {self.store.path}" + (f" · marked {self.store.short(self.marked)}"
                                                                      if self.marked else "")
                  + " · a replay under other settings: kvdeck replay ID --with kv=nvfp4, then compare here")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self.store is None:
            return
        text = event.value.strip()
        if not text:
            self.fill(self.store.list_sessions(200))
        else:
            hits = self.store.search(text, 100)
            ids = list(dict.fromkeys(h["session_id"] for h in hits))
            snippets = {}
            for h in hits:
                snippets.setdefault(h["session_id"], f"t{h['turn']} {h['role']}: {h['snippet']}")
            rows = {s["id"]: s for s in self.store.list_sessions(10_000)}
            self.fill([rows[i] for i in ids if i in rows], snippets)
        self.query_one(DataTable).focus()

    def current(self) -> str:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return ""
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or ""

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        sid = event.row_key.value if event.row_key is not None else ""
        if sid and self.store is not None:
            width = max(30, self.query_one("#detail").size.width - 4)
            self.query_one("#sessiontext", Static).update(session_text(self.store, sid, width))

    def action_mark(self) -> None:
        self.marked = self.current()
        self.note(f"marked {self.store.short(self.marked)}: highlight another and press p to compare")

    def action_compare(self) -> None:
        sid = self.current()
        if not (self.marked and sid) or sid == self.marked:
            self.note("mark a session with m, highlight another, then p")
            return
        from app.tui.screens.compare import CompareScreen

        self.app.push_screen(CompareScreen(self.marked, sid))

    def action_export(self) -> None:
        from app.store.export import export_json

        sid = self.current()
        if not sid:
            return
        path = Path.cwd() / f"kvdeck-session-{self.store.short(sid)}.json"
        path.write_text(export_json(self.store, sid))
        self.note(f"exported to {path}")

    def action_delete(self) -> None:
        sid = self.current()
        if not sid:
            return
        if self._armed != sid:
            self._armed = sid
            self.note(f"press d again to delete session {self.store.short(sid)} (it cannot be undone)")
            return
        self.store.delete(sid)
        self._armed = ""
        self.fill(self.store.list_sessions(200))
        self.note(f"deleted session {sid[:7]}")

    def action_continue_session(self) -> None:
        sid = self.current()
        loaded = self.app.loaded
        if not sid or loaded is None or self.app.state.busy:
            self.note("continue needs a loaded engine and no turn running")
            return
        if getattr(loaded.agent, "turn", 0):
            self.note("continue needs a fresh conversation: reload the engine (F4, Apply) first")
            return
        try:
            loaded.agent.restore(self.store.conversation(sid))
        except ValueError as e:
            self.note(f"cannot continue: {e}")
            return
        self.app.state.note("notice", f"continuing session {self.store.short(sid)}: its completed turns are "
                                      "the history of the next call")
        self.app.pop_screen()
        self.app.sync()
