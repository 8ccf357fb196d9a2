"""Jetson sysfs reader of our own (no dependency): thermals, INA3221 rails, GPU, CPU, nvpmodel, OC events.

Every path is relative to `root` ("/" on a board; a fixture tree in tests). What is read, and in
which unit (sources: jetson-stats' jtop/core/{temperature,power,gpu,cpu}.py, the Linux hwmon
ina3221 and thermal sysfs ABI, NVIDIA's tegra23x-oc-event driver, the Jetson power guide):

- Thermal zones: sys/class/thermal/thermal_zone*/type and /temp, millidegrees C. Zone names follow
  jtop (the type up to its first "-", else its first "_": "cpu-thermal" -> "cpu", "Tboard_tegra" ->
  "Tboard"). -256000 is the BPMP's "sensor offline" value (jtop's TEMPERATURE_OFFLINE = -256 °C; the
  cv*/gpu zones of a power-gated unit report it); on JetPack 6 those zones may fail with EAGAIN
  instead. Both are left out with a note. trip_point_*_type "passive" / trip_point_*_temp (m°C)
  give the software-throttle point: a zone at or above it sets throttle flag "trip:<zone>".
- INA3221 rails: sys/bus/i2c/devices/*/name == "ina3221", then hwmon/hwmon*/in{1,2,3}_label,
  in{N}_input (bus voltage, mV) and curr{N}_input (mA); W = mV * mA / 1e6. Labels "NC" (not
  connected) and channel 7 (sum of shunt voltages) are skipped, as jtop does. The total is the
  VDD_IN rail where the module has one (Orin Nano / NX: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC); otherwise
  (AGX Orin: VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 at 1-0040, VDDQ_VDD2_1V8AO at 1-0041) the sum
  of the rails, as jtop's total_power() does.
- GPU: sys/class/devfreq/*/device/of_node/name in {ga10b, gv11b, gp10b, gpu} (jtop's known iGPU
  names; Orin: 17000000.ga10b on JetPack 5, 17000000.gpu on JetPack 6): cur_freq and max_freq in
  Hz; device/load in per-mille (0..1000) -> %.
- CPU: sys/devices/system/cpu/cpu<N>/cpufreq/scaling_cur_freq and scaling_max_freq in kHz, cores
  with online == 0 skipped; load from proc/stat (busy = total - idle - iowait, between two
  reads); RAM from proc/meminfo (MemTotal, MemAvailable in kB).
- nvpmodel: var/lib/nvpmodel/status ("pmode:0002", written by nvpmodel; read every sample) and
  the mode's name from etc/nvpmodel.conf ("< POWER_MODEL ID=2 NAME=15W >"; read at open).
- Over-current / under-voltage events: sys/class/hwmon/hwmon*/name == "soctherm_oc", then
  oc{1,2,3}_event_cnt (cumulative counters; OC1 under-voltage, OC2 average over-current, OC3
  instantaneous over-current).
Not read: JetPack 4's iio:device rail_name_* power layout (pre-Orin boards) and debugfs (root only).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from app.telemetry.sample import Sample, SourceUnavailable

GPU_OF_NAMES = {"ga10b", "gv11b", "gp10b", "gpu"}
TEMP_OFFLINE_MC = -256000
_LABEL_RE = re.compile(r"^in([1-3])_label$")
_CPU_RE = re.compile(r"^cpu(\d+)$")
_MODE_RE = re.compile(r"POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+?)\s*>")


# ---------------------------------------------------------------------------------------------
# File access: one small read per file; errors come back as text for the notes
# ---------------------------------------------------------------------------------------------

def _read(path: Path) -> str:
    """The file's text (stripped). os.read, not open(): a sensor answering EAGAIN raises OSError
    here instead of the TypeError a buffered text read gives on Python 3.10."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def _read_int(path: Path) -> int:
    text = _read(path)
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        raise ValueError(f"not an integer: {text!r}") from None


def _why(e: Exception) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def _rel(path: Path, root: Path) -> str:
    try:
        return "/" + str(path.relative_to(root))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------
# Discovery (once, at open) and reading (every sample)
# ---------------------------------------------------------------------------------------------

class JetsonSysfs:
    """Source "jetson-sysfs". open() finds the files; read() reads them (one file each)."""

    name = "jetson-sysfs"

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)
        self._zones: list[tuple[str, Path]] = []  # (name, zone dir)
        self._rails: list[tuple[str, Path, int]] = []  # (label, hwmon dir, channel)
        self._gpu: Path | None = None  # devfreq dir
        self._cpus: list[Path] = []
        self._oc: Path | None = None
        self._prev_stat: tuple[int, int] | None = None
        self._trips: dict[str, float] = {}
        self._modes: dict[int, str] = {}  # nvpmodel.conf: mode id -> name (read once)

    def open(self) -> None:
        r = self.root
        self._zones = []
        seen: dict[str, int] = {}
        for z in sorted((r / "sys/class/thermal").glob("thermal_zone*"), key=lambda p: _num(p.name)):
            try:
                raw = _read(z / "type")
            except OSError:
                continue
            base = raw.split("-")[0] if "-" in raw else raw.split("_")[0]
            seen[base] = seen.get(base, 0) + 1
            self._zones.append((base if seen[base] == 1 else f"{base}{seen[base] - 1}", z))
            trip = _passive_trip(z)
            if trip is not None:
                self._trips[self._zones[-1][0]] = trip
        self._rails = []
        for dev in sorted((r / "sys/bus/i2c/devices").glob("*")):
            try:
                if "ina3221" not in _read(dev / "name"):
                    continue
            except OSError:
                continue
            for hw in sorted((dev / "hwmon").glob("hwmon*")):
                for f in sorted(hw.iterdir()):
                    m = _LABEL_RE.match(f.name)
                    if not m:
                        continue
                    try:
                        label = _read(f)
                    except OSError:
                        continue
                    if label and label != "NC":
                        self._rails.append((label, hw, int(m.group(1))))
        self._gpu = None
        for d in sorted((r / "sys/class/devfreq").glob("*")):
            try:
                if _read(d / "device/of_node/name").lower() in GPU_OF_NAMES:
                    self._gpu = d
                    break
            except OSError:
                continue
        cpu_dir = r / "sys/devices/system/cpu"
        self._cpus = sorted((p for p in cpu_dir.glob("cpu*") if _CPU_RE.match(p.name) and (p / "cpufreq").is_dir()),
                            key=lambda p: _num(p.name))
        self._oc = None
        for hw in sorted((r / "sys/class/hwmon").glob("hwmon*")):
            try:
                if _read(hw / "name") == "soctherm_oc":
                    self._oc = hw
                    break
            except OSError:
                continue
        try:
            self._modes = {int(i): n for i, n in _MODE_RE.findall(_read_all(r / "etc/nvpmodel.conf"))}
        except OSError:
            self._modes = {}
        if not self._rails and self._gpu is None:
            raise SourceUnavailable(
                f"not a Jetson: no INA3221 under {r / 'sys/bus/i2c/devices'} and no GPU devfreq "
                f"({'/'.join(sorted(GPU_OF_NAMES))}) under {r / 'sys/class/devfreq'}")

    def close(self) -> None:
        self._prev_stat = None

    def read(self) -> Sample:
        t_mono, t_wall = time.monotonic(), time.time()
        notes: list[str] = []
        temps, throttle = self._read_zones(notes)
        rails = self._read_rails(notes)
        if "VDD_IN" in rails:
            power, scope = rails["VDD_IN"], "VDD_IN"
        elif rails:
            power = sum(rails.values())
            scope = "sum of rails" + (" (VDD_IN unreadable)" if any(n.startswith("rail VDD_IN") for n in notes) else "")
        else:
            power, scope = None, ""
        clocks, caps, load = {}, {}, {}
        self._read_gpu(clocks, caps, load, notes)
        self._read_cpu(clocks, caps, load, notes)
        mem = self._read_meminfo(notes)
        throttle.update(self._read_oc(notes))
        return Sample(t_mono=t_mono, t_wall=t_wall, source=self.name, temps_c=temps, rails_w=rails,
                      power_w=None if power is None else round(power, 4), power_scope=scope,
                      clocks_mhz=clocks, caps_mhz=caps, load_pct=load, mem_mb=mem,
                      power_mode=self._read_mode(), throttle=throttle, notes=tuple(notes))

    # -- per concern ------------------------------------------------------------------------

    def _read_zones(self, notes: list[str]) -> tuple[dict, dict]:
        temps, flags = {}, {}
        for name, z in self._zones:
            try:
                mc = _read_int(z / "temp")
            except (OSError, ValueError) as e:
                notes.append(f"zone {name}: unreadable ({_why(e)})")
                continue
            if mc == TEMP_OFFLINE_MC:
                notes.append(f"zone {name}: offline (-256 °C)")
                continue
            if not -40000 <= mc <= 150000:
                notes.append(f"zone {name}: implausible {mc / 1000:g} °C, left out")
                continue
            temps[name] = mc / 1000.0
            if name in self._trips:
                flags[f"trip:{name}"] = temps[name] >= self._trips[name]
        return temps, flags

    def _read_rails(self, notes: list[str]) -> dict:
        rails = {}
        for label, hw, ch in self._rails:
            try:
                mv = _read_int(hw / f"in{ch}_input")
                ma = _read_int(hw / f"curr{ch}_input")
            except FileNotFoundError as e:
                notes.append(f"rail {label}: missing {_rel(Path(e.filename), self.root)}")
                continue
            except (OSError, ValueError) as e:
                notes.append(f"rail {label}: unreadable ({_why(e)})")
                continue
            rails[label] = round(mv * ma / 1e6, 4)
        return rails

    def _read_gpu(self, clocks: dict, caps: dict, load: dict, notes: list[str]) -> None:
        if self._gpu is None:
            return
        try:
            clocks["gpu"] = _read_int(self._gpu / "cur_freq") / 1e6
            caps["gpu"] = _read_int(self._gpu / "max_freq") / 1e6
        except (OSError, ValueError) as e:
            notes.append(f"gpu clock: unreadable ({_why(e)})")
        try:
            load["gpu"] = _read_int(self._gpu / "device/load") / 10.0
        except (OSError, ValueError) as e:
            notes.append(f"gpu load: unreadable ({_why(e)})")

    def _read_cpu(self, clocks: dict, caps: dict, load: dict, notes: list[str]) -> None:
        cur, mx = [], []
        for c in self._cpus:
            try:
                if (c / "online").exists() and _read(c / "online") == "0":
                    continue
                cur.append(_read_int(c / "cpufreq/scaling_cur_freq") / 1000.0)
                mx.append(_read_int(c / "cpufreq/scaling_max_freq") / 1000.0)
            except (OSError, ValueError) as e:
                notes.append(f"{c.name} clock: unreadable ({_why(e)})")
        if cur:
            clocks["cpu"] = round(sum(cur) / len(cur), 1)
            caps["cpu"] = max(mx) if mx else clocks["cpu"]
        try:
            f = _read(self.root / "proc/stat").splitlines()[0].split()
            vals = [int(x) for x in f[1:]]
            total, idle = sum(vals[:8]), vals[3] + (vals[4] if len(vals) > 4 else 0)
            if self._prev_stat and total > self._prev_stat[0]:
                dt, di = total - self._prev_stat[0], idle - self._prev_stat[1]
                load["cpu"] = round(100.0 * (dt - di) / dt, 1)
            self._prev_stat = (total, idle)
        except (OSError, ValueError, IndexError) as e:
            notes.append(f"cpu load: /proc/stat unreadable ({_why(e)})")

    def _read_meminfo(self, notes: list[str]) -> dict:
        try:
            kv = {}
            for line in _read_all(self.root / "proc/meminfo").splitlines():
                k, _, v = line.partition(":")
                if k in ("MemTotal", "MemAvailable"):
                    kv[k] = int(v.split()[0])
            return {"ram_total": round(kv["MemTotal"] / 1024, 1),
                    "ram_used": round((kv["MemTotal"] - kv["MemAvailable"]) / 1024, 1)}
        except (OSError, ValueError, KeyError, IndexError) as e:
            notes.append(f"ram: /proc/meminfo unreadable ({_why(e)})")
            return {}

    def _read_mode(self) -> str:
        try:
            m = re.search(r"pmode:(\d+)", _read(self.root / "var/lib/nvpmodel/status"))
        except OSError:
            return ""
        if not m:
            return ""
        mode_id = int(m.group(1))
        return f"{self._modes[mode_id]} (id {mode_id})" if mode_id in self._modes else f"id {mode_id}"

    def _read_oc(self, notes: list[str]) -> dict:
        out = {}
        if self._oc is None:
            return out
        for i in (1, 2, 3):
            p = self._oc / f"oc{i}_event_cnt"
            try:
                out[f"oc{i}_event_cnt"] = _read_int(p)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as e:
                notes.append(f"oc{i}_event_cnt: unreadable ({_why(e)})")
        return out


def _read_all(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def _num(name: str) -> int:
    m = re.search(r"(\d+)$", name)
    return int(m.group(1)) if m else -1


def _passive_trip(zone: Path) -> float | None:
    """The lowest passive trip point of a zone in °C (trip_point_<i>_type == passive), or None."""
    best = None
    for t in zone.glob("trip_point_*_type"):
        try:
            if _read(t) != "passive":
                continue
            c = _read_int(zone / t.name.replace("_type", "_temp")) / 1000.0
        except (OSError, ValueError):
            continue
        best = c if best is None else min(best, c)
    return best
