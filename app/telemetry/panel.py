"""The console's thermal-panel reading (app/tui/widgets/power.py's sample dict) from a Sample.

The panel sums `power_w`'s values for its total, so on a board whose total is the VDD_IN rail
(Orin Nano / NX) only that rail is passed (its sub-rails are inside it); elsewhere the rails are.
No textual import here: the TUI calls this through the callable the composition root gives it:

    sampler = Sampler().start()
    read = lambda: panel_dict(sampler.history.latest(), sampler)
"""

from __future__ import annotations

from app.telemetry.sample import Sample


def panel_dict(s: Sample | None, sampler=None) -> dict:
    """{source, cpu_pct, ram_used, ram_total (bytes), temps, power_w {rail: W}, gpu_pct, power_mode,
    throttle (names of active flags), unavailable (a sentence, "" when power is read)}."""
    if s is None:
        why = "; ".join(list(sampler.notes)[-3:]) if sampler is not None and sampler.notes else "no reading yet"
        return {"source": getattr(sampler, "source_name", "") or "none", "temps": {}, "power_w": {},
                "unavailable": f"telemetry: {why}"}
    power = {"VDD_IN": s.power_w} if s.power_scope == "VDD_IN" and s.power_w is not None else dict(s.rails_w)
    gpu = [v for k, v in s.load_pct.items() if k.startswith("gpu")]
    d = {"source": s.source, "cpu_pct": s.load_pct.get("cpu", 0.0),
         "ram_used": s.mem_mb.get("ram_used", 0.0) * 2**20, "ram_total": s.mem_mb.get("ram_total", 0.0) * 2**20,
         "temps": dict(s.temps_c), "power_w": power, "power_mode": s.power_mode,
         "throttle": [k for k, v in s.throttle.items() if v is True],
         "unavailable": "" if power else "board power: unavailable (no power sensor readable on this machine)"}
    if gpu:
        d["gpu_pct"] = max(gpu)
    return d
