"""Asking the operator before a tool with side effects runs (the outbox tools by default).

`ConfirmingExecutor` wraps the agent's executor: for a tool named in `names` (or whose function
has `side_effects = True`) it asks through `ask(name, arguments) -> bool`, which blocks the turn
worker until the operator answers in the UI; a refusal goes back to the model as the tool's
error result. `ConfirmToolScreen` is that question: y runs the call, n (or Esc) refuses it.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

DECLINED = "error: the operator declined this call (it has side effects); tell them it was not done"


class ConfirmingExecutor:
    """Owns nothing but the wrapped executor; called on the turn worker's thread."""

    def __init__(self, inner, toolkit, names: tuple[str, ...], ask: Callable[[str, object], bool]):
        self.inner = inner
        self.toolkit = toolkit
        self.names = set(names)
        self.ask = ask

    def needs_confirm(self, name: str) -> bool:
        tool = self.toolkit.tools.get(name)
        return name in self.names or bool(getattr(getattr(tool, "fn", None), "side_effects", False))

    def __call__(self, turn: int, call_id: str, name: str, arguments):
        if self.needs_confirm(name) and not self.ask(name, arguments):
            from app.agent.executor import Executed

            return Executed(False, DECLINED, 0.0, "error")
        return self.inner(turn, call_id, name, arguments)

    def close(self) -> None:
        self.inner.close()


class ConfirmToolScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Run it"), Binding("n,escape", "answer(False)", "Refuse")]
    DEFAULT_CSS = """
    ConfirmToolScreen { align: center middle; }
    ConfirmToolScreen > Vertical { width: 70; max-width: 96%; height: auto; border: thick $warning;
                                   background: $surface; padding: 0 1; }
    ConfirmToolScreen Horizontal { height: 3; align-horizontal: right; }
    """

    def __init__(self, name: str, arguments) -> None:
        super().__init__()
        self.tool_name = name
        self.arguments = arguments

    def compose(self) -> ComposeResult:
        t = Text()
        t.append(f"The agent wants to call {self.tool_name}", style="bold")
        t.append(" (it has side effects: it writes to the outbox).\n\n")
        t.append(orjson.dumps(self.arguments, option=orjson.OPT_INDENT_2).decode()[:800])
        with Vertical() as v:
            v.border_title = "confirm a tool call"
            yield Static(t)
            with Horizontal():
                yield Button("Refuse (n)", id="no")
                yield Button("Run it (y)", id="yes", variant="warning")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")
