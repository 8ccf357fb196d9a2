"""F1 / ?: every key of the console, by screen. Esc, F1 or q closes it."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("everywhere", (("F1 or ?", "this help"), ("F2", "sessions (list, search, open, replay, export, delete)"),
                    ("F3", "cache inspector (radix tree, last prefix break)"),
                    ("F4", "settings (model, formats, pool, pre-warm, tools) — applied by reloading"),
                    ("Ctrl+T", "next theme: dark, light, 16-colour dark, 16-colour light"),
                    ("Ctrl+Q", "quit"), ("Tab / Shift+Tab", "move between panels and fields"))),
    ("main screen", (("Enter", "send the message"), ("Esc", "cancel the turn in flight (the session stays)"),
                     ("F5 F6 F7 F8", "Chat / Prompt / Pool / Engine tab (80×24 layout)"),
                     ("↑ ↓ PgUp PgDn", "scroll the transcript (when focused)"),
                     ("Enter on a tool call", "expand / collapse its arguments and result"))),
    ("lists", (("↑ ↓", "move"), ("Enter", "open"), ("Esc", "back"))),
)


def keys_table() -> Table:
    t = Table(box=None, show_header=False, padding=(0, 2), pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for section, rows in KEYS:
        t.add_row(f"[underline]{section}[/]", "")
        for key, what in rows:
            t.add_row(key, what)
        t.add_row("", "")
    return t


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q,question_mark", "app.pop_screen", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 80%; max-width: 90; height: 80%; border: round $accent; padding: 0 1;
                                  background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("[b]kvdeck keys[/b] — keyboard first; no mouse needed\n")
            yield Static(keys_table())
