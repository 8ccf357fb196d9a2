"""psutil source: CPU load and clock, RAM, and psutil.sensors_temperatures() where the OS has any.

psutil units: cpu_percent() in %, cpu_freq() in MHz (max 0.0 where the OS does not say),
virtual_memory() in bytes, sensors_temperatures() in °C (Linux: /sys/class/hwmon temp*_input).
It has no power sensor: power_w stays None and the sample says so.

`host_fields(psutil)` is shared: the NVML source adds the host's CPU / RAM with it.
"""

from __future__ import annotations

import time

from app.telemetry.sample import Sample, SourceUnavailable

NO_POWER_NOTE = "board power unavailable: no power sensor readable on this machine"


def host_fields(ps, with_load: bool = True) -> dict:
    """CPU load/clock, RAM and temperatures from the psutil module `ps` (keyword args for Sample).
    with_load=False leaves the CPU load out (the first read after priming cpu_percent has no
    interval to measure over and would report 0 %)."""
    pct = ps.cpu_percent(interval=None)
    load = {"cpu": float(pct)} if with_load else {}
    clocks, caps, temps = {}, {}, {}
    try:
        f = ps.cpu_freq()
    except (OSError, NotImplementedError, AttributeError):
        f = None
    if f is not None and f.current:
        clocks["cpu"] = round(float(f.current), 1)
        if f.max:
            caps["cpu"] = float(f.max)
    vm = ps.virtual_memory()
    mem = {"ram_used": round((vm.total - vm.available) / 2**20, 1), "ram_total": round(vm.total / 2**20, 1)}
    sensors = getattr(ps, "sensors_temperatures", None)
    if sensors is not None:
        try:
            for chip, entries in (sensors() or {}).items():
                for i, e in enumerate(entries):
                    label = e.label or (chip if len(entries) == 1 else f"{chip}{i}")
                    key = label if label not in temps else f"{chip}:{label}"
                    if e.current is not None and -40 <= e.current <= 150:
                        temps[key] = float(e.current)
        except (OSError, RuntimeError):
            pass
    return {"load_pct": load, "clocks_mhz": clocks, "caps_mhz": caps, "mem_mb": mem, "temps_c": temps}


class PsutilSource:
    """Source "psutil": what any Linux (or macOS / Windows) box can report."""

    name = "psutil"

    def __init__(self):
        self._ps = None
        self._primed = 0.0

    def open(self) -> None:
        try:
            import psutil
        except ImportError as e:
            raise SourceUnavailable(f"psutil is not installed ({e})") from None
        self._ps = psutil
        psutil.cpu_percent(interval=None)  # primes the delta; the first real value comes next read
        self._primed = time.monotonic()

    def read(self) -> Sample:
        if self._ps is None:
            raise SourceUnavailable("psutil source read before open()")
        t_mono, t_wall = time.monotonic(), time.time()
        f = host_fields(self._ps, with_load=t_mono - self._primed >= 0.1)
        notes = [NO_POWER_NOTE]
        if not f["temps_c"]:
            notes.append("no temperature sensors exposed (psutil.sensors_temperatures() is empty)")
        return Sample(t_mono=t_mono, t_wall=t_wall, source=self.name, notes=tuple(notes), **f)

    def close(self) -> None:
        self._ps = None
