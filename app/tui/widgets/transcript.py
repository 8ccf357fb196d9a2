"""The transcript: user messages, the streamed answer, collapsible tool calls, notices.

`Transcript.sync(state)` mounts one child per state entry and updates the last ones in place
(the answer being streamed), so a flush costs one Static update, not a re-layout of the log.
"""

from __future__ import annotations

import orjson
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Collapsible, Static

from app.tui.state import ConsoleState, Entry

_ROLE = {"user": ("you", "bold blue"), "answer": ("agent", "bold green"), "notice": ("note", "yellow"),
         "error": ("!", "bold red")}


def _args(value) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


SHOW_CHARS = 800  # a longer message shows its start and its size: laying out 20k chars stalls the UI


def _entry_text(e: Entry) -> Text:
    who, style = _ROLE.get(e.kind, (e.kind, ""))
    t = Text()
    t.append(f"{who:>5} ", style=style)
    body = e.text if e.text else ("…" if not e.done else "")
    if len(body) > SHOW_CHARS:
        body = f"{body[:SHOW_CHARS]}… ({len(body)} characters)"
    t.append(body, style="italic" if e.kind == "notice" else "")
    if e.kind == "answer" and not e.done:
        t.append("▌", style="blink")
    return t


def _tool_title(e: Entry) -> str:
    tool = e.tool
    if tool.ok is None:
        mark = "running"
    else:
        mark = f"{'ok' if tool.ok else 'error'} {tool.elapsed_s * 1000:.0f} ms"
    return f"tool {tool.name or '?'}({_args(tool.arguments)[:40]}) — {mark}"


def _tool_body(e: Entry) -> Text:
    tool = e.tool
    t = Text()
    t.append("arguments ", style="bold")
    t.append(_args(tool.arguments) + "\n")
    t.append("result    ", style="bold")
    t.append(tool.result if tool.ok is not None else "(waiting)", style="" if tool.ok is not False else "red")
    return t


def _signature(e: Entry) -> tuple:
    tool = e.tool
    return (e.kind, len(e.text), e.done, None if tool is None else (tool.ok, len(tool.result)))


class Transcript(VerticalScroll):
    """Owned by the main screen; mutated only by sync()."""

    DEFAULT_CSS = """
    Transcript { height: 1fr; }
    Transcript > Static.entry { margin: 0 0 1 0; }
    Transcript > Collapsible { margin: 0 0 1 0; }
    """

    def __init__(self, state: ConsoleState, **kw) -> None:
        super().__init__(**kw)
        self.state = state
        self.can_focus = True
        self._sigs: list[tuple] = []

    def on_mount(self) -> None:
        self.sync()

    def _make(self, e: Entry):
        if e.kind == "tool":
            c = Collapsible(Static(_tool_body(e), classes="toolbody"), title=_tool_title(e), collapsed=True)
            return c
        return Static(_entry_text(e), classes=f"entry {e.kind}")

    def _update(self, widget, e: Entry) -> None:
        if e.kind == "tool":
            widget.title = _tool_title(e)
            widget.query_one(".toolbody", Static).update(_tool_body(e))
        else:
            widget.update(_entry_text(e))

    def sync(self) -> None:
        entries = self.state.entries
        kids = list(self.children)
        # The first entry whose kind changed: remount from there (a streamed call became a tool call).
        cut = 0
        while cut < min(len(kids), len(entries)) and self._sigs[cut][0] == entries[cut].kind:
            cut += 1
        for w in kids[cut:]:
            w.remove()
        self._sigs = self._sigs[:cut]
        at_end = self.scroll_offset.y >= self.max_scroll_y - 1
        for i, e in enumerate(entries[:cut]):
            sig = _signature(e)
            if sig != self._sigs[i]:
                self._update(kids[i], e)
                self._sigs[i] = sig
        new = [self._make(e) for e in entries[cut:]]
        if new:
            self.mount_all(new)
            self._sigs += [_signature(e) for e in entries[cut:]]
        if at_end or new:
            self.call_after_refresh(self.scroll_end, animate=False)
