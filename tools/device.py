"""`device_status`: temperatures, power and memory from whatever this board exposes.

Sources, each optional: psutil (CPU load, RAM, swap), Linux sysfs thermal zones, Jetson
INA3221 power rails (hwmon), the nvpmodel power mode. What is absent is listed under
"unavailable"; nothing here raises because a source is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

_SYS = Path("/sys")


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except (OSError, ValueError):
        return None


def _temperatures() -> dict[str, float]:
    temps: dict[str, float] = {}
    for zone in sorted((_SYS / "class" / "thermal").glob("thermal_zone*")):
        kind, raw = _read(zone / "type"), _read(zone / "temp")
        if raw and raw.lstrip("-").isdigit():
            temps[kind or zone.name] = round(int(raw) / 1000.0, 1)
    return temps


def _power_rails() -> dict[str, float]:
    """Jetson INA3221: hwmon in{N}_label with in{N}_input (mV) and curr{N}_input (mA) → watts."""
    rails: dict[str, float] = {}
    for hw in sorted((_SYS / "bus" / "i2c" / "drivers" / "ina3221").glob("*/hwmon/hwmon*")):
        for label in sorted(hw.glob("in*_label")):
            n = label.name[2:-6]
            name, mv, ma = _read(label), _read(hw / f"in{n}_input"), _read(hw / f"curr{n}_input")
            if name and mv and ma and mv.isdigit() and ma.isdigit():
                rails[name] = round(int(mv) * int(ma) / 1e6, 2)
    return rails


def _power_mode() -> str | None:
    status = _read(Path("/var/lib/nvpmodel/status"))
    return status.split(":")[-1].strip() if status else None


def device_status(detail: Literal["summary", "full"] = "summary") -> dict:
    """Read this device's temperatures (°C), power rails (W), power mode, CPU load and memory.

    Args:
        detail: "summary" for the hottest sensor and totals, "full" for every sensor
    """
    out: dict = {}
    unavailable: list[str] = []
    try:
        import psutil

        vm = psutil.virtual_memory()
        out["memory"] = {"used_mb": vm.used // 2**20, "total_mb": vm.total // 2**20, "percent": vm.percent}
        out["cpu"] = {"percent": psutil.cpu_percent(interval=0.1), "cores": psutil.cpu_count()}
        try:
            out["cpu"]["load_1m"] = round(psutil.getloadavg()[0], 2)
        except (OSError, AttributeError):
            pass
    except ImportError:
        unavailable.append("memory/cpu (psutil not installed)")
    temps = _temperatures()
    if temps:
        hottest = max(temps, key=temps.get)
        out["temperature_c"] = temps if detail == "full" else {"hottest": hottest, "value": temps[hottest]}
    else:
        unavailable.append("temperatures (no thermal zones)")
    rails = _power_rails()
    if rails:
        out["power_w"] = rails if detail == "full" else {"total": round(sum(rails.values()), 2)}
    else:
        unavailable.append("power rails (no INA3221)")
    mode = _power_mode()
    if mode:
        out["power_mode"] = mode
    else:
        unavailable.append("power mode (no nvpmodel)")
    if unavailable:
        out["unavailable"] = unavailable
    return out
