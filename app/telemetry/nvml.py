"""NVML source (optional extra `nvml`: nvidia-ml-py, imported lazily as `pynvml` in open()).

Per GPU i (names "gpu0", "gpu1", ...), the nvidia-ml-py calls and their units:
  nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)        °C
  nvmlDeviceGetPowerUsage(h)                                mW (board power of that GPU)
  nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)                  MHz
  nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_SM)               MHz, read once at open (it is the
                                                            hardware maximum, and the call costs
                                                            ~1.6 ms of CPU on an H200)
  nvmlDeviceGetUtilizationRates(h).gpu                      %
  nvmlDeviceGetMemoryInfo(h).used / .total                  bytes
  nvmlDeviceGetCurrentClocksEventReasons(h) (older drivers: ...ClocksThrottleReasons)  bit mask
A call a GPU does not support (NVMLError) is left out with a note, once. The host's CPU load,
clock and RAM come from psutil when it is installed (it is a core dependency).
"""

from __future__ import annotations

import time

from app.telemetry.sample import Sample, SourceUnavailable

# nvmlClocksEventReason* bits that mean "slowed down by power or heat" (not idle, not app clocks).
THROTTLE_BITS = {
    "sw_power_cap": 0x04, "hw_slowdown": 0x08, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80,
}


class NvmlSource:
    """Source "nvml": desktop and datacenter NVIDIA GPUs."""

    name = "nvml"

    def __init__(self):
        self._nv = None
        self._handles: list = []
        self._unsupported: set[str] = set()
        self._ps = None
        self._primed = 0.0
        self._max_clock: dict[str, float] = {}

    def open(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise SourceUnavailable("nvidia-ml-py is not installed (pip install 'kvdeck[nvml]')") from None
        try:
            pynvml.nvmlInit()
        except Exception as e:  # pynvml.NVMLError: no driver / no library
            raise SourceUnavailable(f"nvmlInit failed ({e}); no NVIDIA driver here?") from None
        try:
            n = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        except Exception as e:
            pynvml.nvmlShutdown()
            raise SourceUnavailable(f"listing GPUs failed ({e})") from None
        if not self._handles:
            pynvml.nvmlShutdown()
            raise SourceUnavailable("the driver reports no GPU")
        self._nv = pynvml
        # Clock event reasons: the current name, or the deprecated one on drivers without it.
        self._reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        new = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if new is not None:
            try:
                new(self._handles[0])
                self._reasons_fn = new
            except Exception:
                pass
        self._max_clock = {}
        for i, h in enumerate(self._handles):
            try:
                self._max_clock[f"gpu{i}"] = float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
            except Exception:
                pass
        try:
            import psutil

            self._ps = psutil
            psutil.cpu_percent(interval=None)
            self._primed = time.monotonic()
        except ImportError:
            self._ps = None

    def _call(self, key: str, notes: list[str], fn, *args):
        if key in self._unsupported:
            return None
        try:
            return fn(*args)
        except self._nv.NVMLError as e:
            self._unsupported.add(key)
            notes.append(f"{key}: not available ({e})")
            return None

    def read(self) -> Sample:
        nv = self._nv
        if nv is None:
            raise SourceUnavailable("NVML source read before open()")
        t_mono, t_wall = time.monotonic(), time.time()
        notes: list[str] = []
        temps, rails, clocks, caps, load, mem, throttle = {}, {}, {}, {}, {}, {}, {}
        reasons_fn = self._reasons_fn
        for i, h in enumerate(self._handles):
            g = f"gpu{i}"
            t = self._call(f"{g} temperature", notes, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            if t is not None:
                temps[g] = float(t)
            p = self._call(f"{g} power", notes, nv.nvmlDeviceGetPowerUsage, h)
            if p is not None:
                rails[g] = p / 1000.0
            c = self._call(f"{g} clock", notes, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            if c is not None:
                clocks[g] = float(c)
            if g in self._max_clock:
                caps[g] = self._max_clock[g]
            u = self._call(f"{g} utilisation", notes, nv.nvmlDeviceGetUtilizationRates, h)
            if u is not None:
                load[g] = float(u.gpu)
            mi = self._call(f"{g} memory", notes, nv.nvmlDeviceGetMemoryInfo, h)
            if mi is not None:
                mem[f"{g}_used"] = round(mi.used / 2**20, 1)
                mem[f"{g}_total"] = round(mi.total / 2**20, 1)
            r = self._call(f"{g} clock event reasons", notes, reasons_fn, h) if reasons_fn else None
            if r is not None:
                for name, bit in THROTTLE_BITS.items():
                    throttle[f"{g}:{name}"] = bool(r & bit)
        if self._ps is not None:
            from app.telemetry.host import host_fields

            hf = host_fields(self._ps, with_load=t_mono - self._primed >= 0.1)
            load.update(hf["load_pct"])
            clocks.update(hf["clocks_mhz"])
            caps.update(hf["caps_mhz"])
            mem.update(hf["mem_mb"])
            for k, v in hf["temps_c"].items():
                temps.setdefault(k, v)
        power = round(sum(rails.values()), 3) if rails else None
        scope = f"GPU board power (NVML, {len(rails)} GPU{'s' if len(rails) != 1 else ''})" if rails else ""
        return Sample(t_mono=t_mono, t_wall=t_wall, source=self.name, temps_c=temps, rails_w=rails,
                      power_w=power, power_scope=scope, clocks_mhz=clocks, caps_mhz=caps, load_pct=load,
                      mem_mb=mem, throttle=throttle, notes=tuple(notes))

    def close(self) -> None:
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
        self._nv = None
        self._handles = []
