"""F1 / ?: every key of the console, by screen. Esc, F1 or q closes it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("everywhere", (("F1 or ?", "this help"), ("F2", "stored sessions"), ("F3", "cache inspector (radix tree)"),
                    ("F4", "settings (applied by reloading the engine)"),
                    ("Ctrl+T", "theme: dark, light, 16-colour dark / light"),
                    ("Ctrl+Q", "quit"), ("Tab, Shift+Tab", "next / previous panel or field"))),
    ("main screen", (("Enter", "send the message"), ("Esc", "cancel the turn (the session stays)"),
                     ("F5 F6 F7 F8", "Chat, Prompt, Pool, Engine tabs (80×24)"),
                     ("↑ ↓ PgUp PgDn", "scroll the focused panel"),
                     ("Enter on a tool", "show its arguments, result and time"))),
    ("sessions (F2)", (("text + Enter", "search messages and tool results"),
                       ("↑ ↓", "highlight: its ledger and messages"),
                       ("c", "continue it here (fresh conversation)"),
                       ("m, then p", "mark one, compare another with it"),
                       ("e", "export JSON to the current folder"), ("d d", "delete"), ("Esc", "back"))),
    ("cache inspector (F3)", (("↑ ↓ ← →", "move, fold, unfold"), ("r", "read the tree again"), ("Esc", "back"))),
    ("settings (F4)", (("Tab", "next field"), ("Ctrl+S", "apply: reload the engine"), ("Esc", "cancel"))),
)


def keys_text() -> Text:
    """The keys, one per line: the key in a 16-cell column, then what it does."""
    t = Text()
    for section, rows in KEYS:
        t.append(f"{section}\n", style="bold underline")
        for key, what in rows:
            t.append(f"  {key:<16}", style="bold")
            t.append(f"{what}\n")
        t.append("\n")
    return t


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q,question_mark", "app.pop_screen", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 96%; max-width: 76; height: 90%; border: round $accent; padding: 0 1;
                                  background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("[b]kvdeck keys[/b] — keyboard first; no mouse needed\n")
            yield Static(keys_text())
