"""The prefix-break banner: shown while the last call broke the prefix (segment, index, diff)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from app.tui.state import Banner, ConsoleState


def banner_text(b: Banner) -> Text:
    t = Text()
    t.append(f" PREFIX BREAK ({b.cause}) ", style="bold reverse red")
    t.append(f" call {b.turn}.{b.call}: segment {b.segment} at token {b.index}; "
             f"promised {b.promised}, cached {b.cached}\n")
    t.append(f"  …{b.before[-30:]!r} ", style="dim")
    t.append(f"- {b.old[:40]!r} ", style="red")
    t.append(f"+ {b.new[:40]!r}", style="green")
    return t


class PrefixBanner(Static):
    DEFAULT_CSS = """
    PrefixBanner { height: auto; display: none; border-left: thick $error; padding: 0 1; }
    PrefixBanner.-shown { display: block; }
    """

    def __init__(self, state: ConsoleState, **kw) -> None:
        super().__init__(**kw)
        self.state = state

    def on_mount(self) -> None:
        self.sync()

    def sync(self) -> None:
        b = self.state.banner
        self.set_class(b is not None, "-shown")
        if b is not None:
            self.update(banner_text(b))
