"""Thermals and power: whatever the sampler reads, with sparklines; says what is unavailable.

A sample is a dict: cpu_pct, ram_used, ram_total (bytes), temps {zone: °C}, power_w {rail: W}
(empty when the machine exposes no power rails), gpu_pct, source (what read it), and
`unavailable` (a sentence for what no source could read).
"""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from app.tui.widgets.pool import fmt_bytes

HOT_C = 85.0  # a zone at or above this is flagged


def psutil_sample() -> dict:
    """One reading from psutil (non-blocking: cpu_percent since the previous call)."""
    import psutil

    vm = psutil.virtual_memory()
    temps: dict[str, float] = {}
    read = getattr(psutil, "sensors_temperatures", None)
    for zone, items in ((read() if read else None) or {}).items():
        for i, it in enumerate(items):
            temps[it.label or f"{zone}{i}"] = float(it.current)
    return {"source": "psutil", "cpu_pct": psutil.cpu_percent(None), "ram_used": vm.total - vm.available,
            "ram_total": vm.total, "temps": temps, "power_w": {},
            "unavailable": "board power: unavailable (no power rails readable on this machine)"}


class PowerPanel(Vertical):
    BORDER_TITLE = "thermals · power"
    DEFAULT_CSS = """
    PowerPanel { height: 1fr; }
    PowerPanel #readings { height: auto; }
    PowerPanel Sparkline { height: 2; }
    PowerPanel .label { height: 1; color: $text-muted; }
    """

    def __init__(self, history: dict, **kw) -> None:
        super().__init__(**kw)
        self.history = history  # shared with the app: {"cpu": deque, "ram": deque, "last": sample}

    def compose(self) -> ComposeResult:
        yield Static(id="readings")
        yield Static("CPU %", classes="label")
        yield Sparkline([], id="cpu")
        yield Static("RAM used", classes="label")
        yield Sparkline([], id="ram")

    def on_mount(self) -> None:
        self.sync()

    def sync(self) -> None:
        s = self.history.get("last")
        r = self.query_one("#readings", Static)
        if not s:
            r.update(Text("telemetry: no reading yet", style="italic"))
            return
        t = Text()
        t.append(f"source {s.get('source', '?')}\n", style="bold")
        t.append(f"CPU {s.get('cpu_pct', 0):.0f}%   RAM {fmt_bytes(s.get('ram_used', 0))} / "
                 f"{fmt_bytes(s.get('ram_total', 0))}\n")
        temps = s.get("temps") or {}
        if temps:
            for zone, c in list(temps.items())[:6]:
                t.append(f"{zone} {c:.0f}°C  ", style="bold red" if c >= HOT_C else "")
            t.append("\n")
            if max(temps.values()) >= HOT_C:
                t.append(f"⚠ a zone is at or above {HOT_C:.0f}°C\n", style="bold red")
        else:
            t.append("temperatures: none readable\n", style="italic")
        power = s.get("power_w") or {}
        if power:
            t.append("  ".join(f"{k} {v:.1f} W" for k, v in power.items()) + f"   total {sum(power.values()):.1f} W\n")
        elif s.get("unavailable"):
            t.append(s["unavailable"] + "\n", style="italic")
        r.update(t)
        self.query_one("#cpu", Sparkline).data = list(self.history.get("cpu", [])) or [0]
        self.query_one("#ram", Sparkline).data = list(self.history.get("ram", [])) or [0]


def new_history(n: int = 120) -> dict:
    return {"cpu": deque(maxlen=n), "ram": deque(maxlen=n), "last": None}


def record(history: dict, sample: dict) -> None:
    history["last"] = sample
    history["cpu"].append(float(sample.get("cpu_pct", 0.0)))
    history["ram"].append(float(sample.get("ram_used", 0)) / 2**20)
