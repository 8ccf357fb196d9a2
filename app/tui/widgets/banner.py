"""The prefix-break banner: shown while the last call broke the prefix (segment, index, diff)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from app.tui.state import Banner, ConsoleState


def banner_text(b: Banner, wrap: bool = True) -> Text:
    """Two lines: what broke where, then the diff (old, new). wrap=False: each line cut to the width."""
    t = Text(no_wrap=not wrap, overflow="ellipsis")
    t.append(f" PREFIX BREAK ({b.cause}) ", style="bold reverse red")
    t.append(f" call {b.turn}.{b.call}: {b.segment} at token {b.index}, cached {b.cached} of {b.promised}\n")
    t.append(f" - {b.old[:60]!r}", style="bold red")
    t.append(f"  + {b.new[:60]!r}", style="bold green")
    if wrap:
        t.append(f"\n after …{b.before[-40:]!r}", style="dim")
    return t


class PrefixBanner(Static):
    DEFAULT_CSS = """
    PrefixBanner { height: 2; display: none; border-left: thick $error; padding: 0 0 0 1; }
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
            self.update(banner_text(b, wrap=False))
