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


def as_reading(s) -> dict | None:
    """A reading dict from an app.telemetry Sample (duck-typed: temps_c, rails_w, power_w, load_pct,
    mem_mb MB, throttle, notes) or a dict already in this module's shape."""
    if s is None or isinstance(s, dict):
        return s
    if hasattr(s, "values") and hasattr(s, "source") and not hasattr(s, "mem_mb"):  # a TelemetrySample event
        from types import SimpleNamespace

        s = SimpleNamespace(source=s.source, **s.values)
    mem = getattr(s, "mem_mb", {}) or {}
    load = getattr(s, "load_pct", {}) or {}
    rails = dict(getattr(s, "rails_w", {}) or {})
    total = getattr(s, "power_w", None)
    notes = [n for n in (getattr(s, "notes", ()) or ()) if "power" in n]
    throttle = getattr(s, "throttle", {}) or {}
    return {"source": getattr(s, "source", "?"), "cpu_pct": float(load.get("cpu", 0.0)),
            "gpu_pct": load.get("gpu"), "ram_used": mem.get("ram_used", 0) * 2**20,
            "ram_total": mem.get("ram_total", 0) * 2**20, "temps": dict(getattr(s, "temps_c", {}) or {}),
            "power_w": rails, "power_total_w": total, "power_scope": getattr(s, "power_scope", ""),
            "power_mode": getattr(s, "power_mode", ""), "clocks": dict(getattr(s, "clocks_mhz", {}) or {}),
            "throttling": any(v is True for v in throttle.values()),
            "unavailable": notes[0] if notes and total is None and not rails else ""}


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

    def __init__(self, history: dict, state=None, **kw) -> None:
        super().__init__(**kw)
        self.state = state  # the ConsoleState, for joules per turn (None: not shown)
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
        t.append(f"source {s.get('source', '?')}", style="bold")
        if s.get("power_mode"):
            t.append(f" · mode {s['power_mode']}")
        t.append(f"\nCPU {s.get('cpu_pct', 0):.0f}%   RAM {fmt_bytes(s.get('ram_used', 0))} / "
                 f"{fmt_bytes(s.get('ram_total', 0))}")
        if s.get("gpu_pct") is not None:
            gpu_clock = (s.get("clocks") or {}).get("gpu")
            t.append(f"   GPU {s['gpu_pct']:.0f}%" + (f" @ {gpu_clock:.0f} MHz" if gpu_clock else ""))
        t.append("\n")
        if s.get("throttling"):
            t.append("⚠ throttling\n", style="bold red")
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
        total = s.get("power_total_w")
        if power or total is not None:
            total = sum(power.values()) if total is None else total
            t.append("  ".join(f"{k} {v:.1f} W" for k, v in list(power.items())[:4]))
            t.append(f"  total {total:.1f} W {s.get('power_scope', '')}\n", style="bold")
        elif s.get("unavailable"):
            t.append(s["unavailable"] + "\n", style="italic")
        st = self.state
        joules = st.turn_energy_j(st.turn) if st is not None and st.turn else None
        if joules is not None:
            t.append(f"turn {st.turn}: {joules:.1f} J", style="bold")
        r.update(t)
        cpu, ram = list(self.history.get("cpu", [])), list(self.history.get("ram", []))
        labels = self.query(".label")
        if cpu:
            labels[0].update(f"CPU % ({len(cpu)} readings) {min(cpu):.0f}–{max(cpu):.0f}")
        if ram:
            labels[1].update(f"RAM MiB {min(ram):.0f}–{max(ram):.0f}")
        self.query_one("#cpu", Sparkline).data = cpu or [0]
        self.query_one("#ram", Sparkline).data = ram or [0]


def new_history(n: int = 120) -> dict:
    return {"cpu": deque(maxlen=n), "ram": deque(maxlen=n), "last": None}


def record(history: dict, sample) -> None:
    sample = as_reading(sample)
    if sample is None:
        return
    history["last"] = sample
    history["cpu"].append(float(sample.get("cpu_pct", 0.0)))
    history["ram"].append(float(sample.get("ram_used", 0)) / 2**20)
