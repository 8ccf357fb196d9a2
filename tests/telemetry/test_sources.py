"""NVML and jtop behind fakes of their own APIs (sys.modules), the fallback order, the sampler thread."""

from __future__ import annotations

import sys
import threading
import time
import types
from types import SimpleNamespace

import pytest

from app.telemetry.nvml import NvmlSource
from app.telemetry.sample import Sample, SourceUnavailable
from app.telemetry.sampler import Sampler
from app.telemetry.sources import make_source, open_first

# ---------------------------------------------------------------------------------------------
# Fakes: the subset of each package's API our modules call, with the real names and units
# ---------------------------------------------------------------------------------------------


def fake_pynvml(init_error: str | None = None, power_supported: bool = True, reasons: int = 0x21,
                old_driver: bool = False):
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        if init_error:
            raise NVMLError(init_error)

    def power(h):
        if not power_supported:
            raise NVMLError("Not Supported")
        return 287_500  # mW

    nv.NVMLError = NVMLError
    nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM = 0, 1
    nv.calls = []
    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 38 if sensor == 0 else -1
    nv.nvmlDeviceGetPowerUsage = power
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980 if kind == 1 else 0
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980 if kind == 1 else 0
    nv.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=97, memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=3 * 2**30, total=141 * 2**30, free=138 * 2**30)
    def event_reasons(h):
        if old_driver:
            raise NVMLError("Function Not Found")
        return reasons

    nv.nvmlDeviceGetCurrentClocksEventReasons = event_reasons
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: reasons  # deprecated name, same mask
    return nv


def fake_jtop(service_up: bool = True):
    mod = types.ModuleType("jtop")

    class JtopException(Exception):
        pass

    class jtop:  # noqa: N801 (the package's own class name)
        def __init__(self, interval=1.0):
            self.interval = interval
            self.temperature = {"cpu": {"temp": 47.5, "online": True}, "cv0": {"temp": -256, "online": False}}
            self.power = {"rail": {"VDD_CPU_GPU_CV": {"volt": 5064, "curr": 232, "power": 1174}},
                          "tot": {"volt": 5064, "curr": 1004, "power": 5084, "name": "VDD_IN"}}
            self.gpu = {"gpu": {"status": {"load": 12.0}, "freq": {"cur": 306000, "max": 625000}}}
            self.cpu = {"cpu": [{"online": True, "idle": 80.0, "freq": {"cur": 729600, "max": 1510400}},
                                {"online": True, "idle": 60.0, "freq": {"cur": 729600, "max": 1510400}},
                                {"online": False}]}
            self.memory = {"RAM": {"used": 2_519_000, "tot": 7_620_000}}
            self.nvpmodel = type("NVPModel", (), {"id": 0, "__str__": lambda s: "15W"})()
            self.closed = False

        def start(self):
            if not service_up:
                raise JtopException("The jtop.service is not active. Please run:\nsudo jtop --install-service")

        def ok(self, spin=False):
            return True

        def close(self):
            self.closed = True

    mod.jtop, mod.JtopException = jtop, JtopException
    return mod


# ---------------------------------------------------------------------------------------------
# NVML and jtop
# ---------------------------------------------------------------------------------------------


def test_nvml_reads_through_its_api_in_its_units(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    src = NvmlSource()
    src.open()
    s = src.read()
    assert s.temps_c["gpu0"] == 38.0 and s.rails_w == {"gpu0": 287.5} and s.power_w == 287.5
    assert s.power_scope == "GPU board power (NVML, 1 GPU)"
    assert s.clocks_mhz["gpu0"] == 1980.0 and s.caps_mhz["gpu0"] == 1980.0 and s.load_pct["gpu0"] == 97.0
    assert s.mem_mb["gpu0_used"] == 3072.0 and s.mem_mb["gpu0_total"] == 141 * 1024
    # 0x21 = GpuIdle | SwThermalSlowdown: only the thermal bit is a throttle flag.
    assert s.throttle["gpu0:sw_thermal"] is True and s.throttle["gpu0:sw_power_cap"] is False
    assert "ram_total" in s.mem_mb  # the host's RAM comes from psutil alongside
    src.close()
    assert sys.modules["pynvml"].calls == ["shutdown"]


def test_nvml_old_driver_uses_the_deprecated_throttle_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(old_driver=True, reasons=0x44))
    src = NvmlSource()
    src.open()
    s = src.read()
    assert s.throttle["gpu0:sw_power_cap"] and s.throttle["gpu0:hw_thermal"] and not s.throttle["gpu0:sw_thermal"]
    assert not any("reasons" in n for n in s.notes)


def test_nvml_unsupported_call_is_noted_once_and_left_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(power_supported=False))
    src = NvmlSource()
    src.open()
    a, b = src.read(), src.read()
    assert a.power_w is None and b.power_w is None and a.power_scope == ""
    assert "gpu0 power: not available (Not Supported)" in a.notes and not b.notes


def test_nvml_missing_package_or_driver_is_said_clearly(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    with pytest.raises(SourceUnavailable, match=r"nvidia-ml-py is not installed \(pip install 'kvdeck\[nvml\]'\)"):
        NvmlSource().open()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error="Driver Not Loaded"))
    with pytest.raises(SourceUnavailable, match="nvmlInit failed .Driver Not Loaded."):
        NvmlSource().open()


def test_jtop_reads_through_its_api(monkeypatch):
    monkeypatch.setitem(sys.modules, "jtop", fake_jtop())
    src = make_source("jtop")
    src.open()
    s = src.read()
    assert s.source == "jtop" and s.temps_c == {"cpu": 47.5} and "zone cv0: offline" in s.notes
    assert s.power_w == 5.084 and s.power_scope == "VDD_IN" and s.rails_w == {"VDD_CPU_GPU_CV": 1.174}
    assert s.clocks_mhz == {"gpu": 306.0, "cpu": 729.6} and s.caps_mhz == {"gpu": 625.0, "cpu": 1510.4}
    assert s.load_pct == {"gpu": 12.0, "cpu": 30.0}  # offline core left out: 100 - mean(80, 60)
    assert s.mem_mb == {"ram_used": round(2_519_000 / 1024, 1), "ram_total": round(7_620_000 / 1024, 1)}
    assert s.power_mode == "15W (id 0)"
    src.close()


def test_jtop_missing_package_or_service_is_said_clearly(monkeypatch):
    monkeypatch.setitem(sys.modules, "jtop", None)
    with pytest.raises(SourceUnavailable, match=r"jetson-stats is not installed \(pip install 'kvdeck\[jetson\]'\)"):
        make_source("jtop").open()
    monkeypatch.setitem(sys.modules, "jtop", fake_jtop(service_up=False))
    with pytest.raises(SourceUnavailable, match="jtop service is not usable .The jtop.service is not active. "
                                                 "Please run: sudo jtop --install-service"):
        make_source("jtop").open()


# ---------------------------------------------------------------------------------------------
# Fallback order and the sampler thread
# ---------------------------------------------------------------------------------------------


def test_fallback_order_first_working_source_wins(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "jtop", fake_jtop(service_up=False))
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    chain = ["jtop", "jetson-sysfs", "nvml", "psutil"]
    src, first, notes = open_first(chain, lambda n: make_source(n, sysfs_root=str(tmp_path)))
    assert src.name == "nvml" and first.power_w == 287.5
    assert [n.split(":")[0] for n in notes] == ["jtop", "jetson-sysfs"]
    src.close()
    monkeypatch.setitem(sys.modules, "pynvml", None)
    src, first, notes = open_first(chain, lambda n: make_source(n, sysfs_root=str(tmp_path)))
    assert src.name == "psutil" and first.power_w is None
    assert "board power unavailable" in first.notes[0]
    assert notes[2] == "nvml: nvidia-ml-py is not installed (pip install 'kvdeck[nvml]')"


class Scripted:
    """A Source that returns `n` samples, then raises `error` (a source failing mid-run)."""

    def __init__(self, name, n, error=RuntimeError("sensor bus went away")):
        self.name, self.n, self.error, self.reads, self.closed = name, n, error, 0, False

    def open(self):
        if self.n < 0:
            raise SourceUnavailable("not here")

    def read(self):
        self.reads += 1
        if self.reads > self.n:
            raise self.error
        return Sample(t_mono=time.monotonic(), t_wall=time.time(), source=self.name, power_w=float(self.reads))

    def close(self):
        self.closed = True


def test_sampler_drops_a_failing_source_for_the_next_and_stops_cleanly():
    made = {"a": Scripted("a", -1), "b": Scripted("b", 2), "c": Scripted("c", 10**6)}
    got = []
    sm = Sampler(interval=0.01, chain=["a", "b", "c"], factory=made.__getitem__, on_sample=got.append).start()
    deadline = time.monotonic() + 5
    while sm.source_name != "c" and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert sm._thread.daemon and sm.running
    sm.stop()
    assert not sm.running and made["b"].closed and made["c"].closed
    assert [s.source for s in got[:2]] == ["b", "b"] and got[2].source == "c"
    notes = list(sm.notes)
    assert notes[0] == "telemetry source a: not here"
    assert "telemetry source b failed mid-run (RuntimeError: sensor bus went away); trying c" in notes
    assert sm.history.latest().source == "c"


def test_sampler_with_no_working_source_says_so_and_ends():
    sm = Sampler(interval=0.01, chain=["a"], factory=lambda n: Scripted(n, -1)).start()
    sm._thread.join(5)
    assert not sm.running and sm.source_name == "none"
    assert sm.notes[-1] == "no telemetry source works here: a: not here"
    assert sm.request_sample(wait=0.05) is None  # never hangs, never raises


def test_request_sample_reads_now_not_at_the_next_tick():
    sm = Sampler(interval=30.0, chain=["c"], factory=lambda n: Scripted(n, 10**6)).start()
    try:
        t = time.monotonic()
        deadline = t + 5
        while sm.history.latest() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        s = sm.request_sample(wait=2.0)
        assert s is not None and s.power_w == 2.0 and time.monotonic() - t < 2.0
        t1 = time.monotonic()
        c = sm.summarize(t, t1, tokens=10)
        # summarize() took a fresh reading after t1, so both edges are interpolated, none held.
        assert c.source == "c" and c.samples == 1 and c.held_s == 0.0
        assert len(sm.history) == 3 and sm.history.latest().t_mono > t1
    finally:
        sm.stop()


def test_sampler_own_cpu_cost_is_under_one_percent_of_a_core_at_1hz():
    """psutil at 50 Hz for ~0.6 s: CPU per read measured by the thread itself, scaled to 1 Hz."""
    sm = Sampler(interval=0.02, chain=["psutil"]).start()
    time.sleep(0.6)
    sm.stop()
    reads = sm.reads - 1
    assert reads >= 10, f"only {reads} reads in 0.6 s"
    per_read_s = (sm.cpu_s - sm.open_cpu_s) / reads
    at_1hz_pct = 100.0 * per_read_s * 1.0
    print(f"sampler: {per_read_s * 1000:.3f} ms CPU per psutil read -> {at_1hz_pct:.3f}% of one core at 1 Hz")
    assert at_1hz_pct <= 1.0
    assert threading.active_count() >= 1 and not sm.running


def test_import_rules_jtop_in_one_module_and_nothing_heavy_on_import():
    import re
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    users = [p.relative_to(repo).as_posix() for p in (repo / "app").rglob("*.py")
             if re.search(r"^\s*(import jtop|from jtop\b)", p.read_text(), re.M)]
    assert users == ["app/telemetry/jtop_source.py"]
    code = ("import sys, app.telemetry, app.telemetry.cli; "
            "print(sorted(m for m in ('textual', 'jtop', 'pynvml', 'app.agent', 'app.tui', 'app.engine') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
