"""F4: settings — model, weight / KV format, pool size, threads, pre-warm, trim ahead, tool choice, tools.

Applying reloads the engine with progress (the main screen's status line and bar); the
conversation starts again on the new engine. Tab moves between fields, Ctrl+S applies, Esc leaves.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, Switch

from app.tui.messages import ReloadEngine
from app.tui.services import ConsoleOptions

WEIGHTS = ("nvfp4", "w4a8", "f16", "f32")
KV = ("f32", "f16", "nvfp4", "nvfp4r", "k8v4", "kpc4")
CHOICES = ("auto", "required", "none")


def parse_options(base: ConsoleOptions, fields: dict[str, object]) -> ConsoleOptions:
    """The options from the form's values; ValueError names the field that is wrong."""
    def count(name: str, low: int) -> int:
        raw = str(fields[name]).strip() or "0"
        try:
            v = int(raw)
        except ValueError:
            raise ValueError(f"{name}: {raw!r} is not a whole number") from None
        if v < low:
            raise ValueError(f"{name}: must be >= {low}, got {v}")
        return v

    model = str(fields["model"]).strip()
    if not model:
        raise ValueError("model: give a model name (e.g. smollm2-135m) or a folder")
    return base.with_(model=model, weights=str(fields["weights"]), kv=str(fields["kv"]),
                      kv_pages=count("kv_pages", 0), threads=count("threads", 0),
                      max_tokens=count("max_tokens", 1), prewarm=bool(fields["prewarm"]),
                      trim_ahead=bool(fields.get("trim_ahead", base.trim_ahead)),
                      tools=bool(fields["tools"]), tool_choice=str(fields["tool_choice"]))


class SettingsScreen(ModalScreen):
    BINDINGS = [Binding("escape", "app.pop_screen", "Cancel"), Binding("ctrl+s", "apply", "Apply")]
    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen > VerticalScroll { width: 76; max-width: 100%; height: auto; max-height: 100%;
                                      border: round $accent; background: $surface; padding: 0 1; }
    SettingsScreen Grid { grid-size: 2; grid-columns: 18 1fr; grid-rows: 3; height: auto; }
    SettingsScreen Label { padding: 1 0 0 0; }
    SettingsScreen #error { color: $error; height: auto; }
    SettingsScreen #buttons { height: 3; align-horizontal: right; }
    """

    def __init__(self, options: ConsoleOptions) -> None:
        super().__init__()
        self.options = options

    def compose(self) -> ComposeResult:
        o = self.options
        with VerticalScroll() as v:
            v.border_title = "settings — applied by reloading the engine"
            with Grid():
                yield Label("model")
                yield Input(o.model, id="model")
                yield Label("weights")
                yield Select([(w, w) for w in WEIGHTS], value=o.weights, allow_blank=False, id="weights")
                yield Label("KV format")
                yield Select([(k, k) for k in KV], value=o.kv, allow_blank=False, id="kv")
                yield Label("KV pool pages")
                yield Input(str(o.kv_pages), placeholder="0: the model's context", id="kv_pages")
                yield Label("CPU threads")
                yield Input(str(o.threads), placeholder="0: all cores", id="threads")
                yield Label("max tokens")
                yield Input(str(o.max_tokens), id="max_tokens")
                yield Label("pre-warm prefix")
                yield Switch(o.prewarm, id="prewarm")
                yield Label("trim ahead")
                yield Switch(o.trim_ahead, id="trim_ahead")
                yield Label("tools")
                yield Switch(o.tools, id="tools")
                yield Label("tool choice")
                choices = CHOICES if o.tool_choice in CHOICES else (*CHOICES, o.tool_choice)
                yield Select([(c, c) for c in choices], value=o.tool_choice, allow_blank=False, id="tool_choice")
            yield Static("", id="error")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Apply (Ctrl+S)", id="apply", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#model", Input).focus()

    def values(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for w in self.query("Input, Select, Switch"):
            if w.id:
                out[w.id] = w.value
        return out

    def action_apply(self) -> None:
        try:
            opts = parse_options(self.options, self.values())
        except ValueError as e:
            self.query_one("#error", Static).update(str(e))
            return
        self.app.pop_screen()
        self.app.post_message(ReloadEngine(opts))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.app.pop_screen()
