"""The Jetson sysfs reader on fixture trees laid out as on an AGX Orin and an Orin Nano."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from app.telemetry.jetson_sysfs import JetsonSysfs
from app.telemetry.sample import SourceUnavailable

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture
def tree(tmp_path):
    """tree(name) -> a private copy of a fixture tree (tests change files in it)."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIX / name, dst)
        return dst

    return copy


def read_once(root: Path):
    src = JetsonSysfs(root)
    src.open()
    return src, src.read()


def test_agx_orin_tree(tree):
    _, s = read_once(tree("agx_orin"))
    # Two INA3221s, NC channels and the channel-7 sum skipped; no VDD_IN rail -> the sum of the rails.
    assert s.rails_w == {"VDD_GPU_SOC": 2.3875, "VDD_CPU_CV": 0.7831, "VIN_SYS_5V0": 3.5237,
                         "VDDQ_VDD2_1V8AO": 0.2995}
    assert s.power_scope == "sum of rails"
    assert s.power_w == pytest.approx(2.3875 + 0.7831 + 3.5237 + 0.2995, abs=1e-4)
    # Zones: "-thermal" and "_tegra" suffixes cut as jtop does; cv0..cv2 at -256 °C are offline.
    assert s.temps_c == {"cpu": 41.437, "gpu": 40.5, "soc0": 39.031, "soc1": 38.937, "soc2": 39.062,
                         "tj": 41.656, "Tboard": 29.0, "Tdiode": 30.75}
    assert [n for n in s.notes if "offline" in n] == [f"zone cv{i}: offline (-256 °C)" for i in range(3)]
    # GPU devfreq 17000000.ga10b (Hz -> MHz, load per-mille -> %), not the vic devfreq device.
    assert s.clocks_mhz["gpu"] == 624.75 and s.caps_mhz["gpu"] == 1300.5 and s.load_pct["gpu"] == 45.3
    # MODE_30W: cores 8..11 offline are not averaged in; kHz -> MHz.
    assert s.clocks_mhz["cpu"] == 1420.8 and s.caps_mhz["cpu"] == 2201.6
    assert s.power_mode == "MODE_30W (id 2)"
    assert s.throttle == {"trip:cpu": False, "trip:gpu": False, "oc1_event_cnt": 0, "oc2_event_cnt": 0,
                          "oc3_event_cnt": 0}
    assert s.mem_mb == {"ram_total": round(31010632 / 1024, 1), "ram_used": round((31010632 - 27450000) / 1024, 1)}


def test_orin_nano_tree_fewer_rails_and_vdd_in_total(tree):
    _, s = read_once(tree("orin_nano"))
    assert s.rails_w == {"VDD_IN": 5.0843, "VDD_CPU_GPU_CV": 1.1748, "VDD_SOC": 1.4787}
    assert s.power_w == 5.0843 and s.power_scope == "VDD_IN"  # the module input, not a sum
    assert s.clocks_mhz["gpu"] == 306.0 and s.caps_mhz["gpu"] == 625.0 and s.load_pct["gpu"] == 12.0
    assert set(s.temps_c) == {"cpu", "gpu", "soc0", "soc1", "soc2", "tj"}
    assert s.power_mode == "15W (id 0)"


def test_missing_rail_is_left_out_with_a_note(tree):
    root = tree("agx_orin")
    (root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/curr3_input").unlink()
    _, s = read_once(root)
    assert "VIN_SYS_5V0" not in s.rails_w
    assert s.power_w == pytest.approx(2.3875 + 0.7831 + 0.2995, abs=1e-4)
    assert "rail VIN_SYS_5V0: missing /sys/bus/i2c/devices/1-0040/hwmon/hwmon1/curr3_input" in s.notes


def test_unreadable_vdd_in_falls_back_to_the_sum_and_says_so(tree):
    root = tree("orin_nano")
    f = root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/in1_input"
    f.unlink()
    f.mkdir()  # reading it fails with EISDIR (root ignores chmod 000, a directory cannot be read)
    _, s = read_once(root)
    assert "VDD_IN" not in s.rails_w
    assert s.power_scope == "sum of rails (VDD_IN unreadable)"
    assert s.power_w == pytest.approx(1.1748 + 1.4787, abs=1e-4)
    assert any(n.startswith("rail VDD_IN: unreadable (") for n in s.notes)


def test_zone_answering_eagain_or_garbage_is_left_out(tree, monkeypatch):
    root = tree("orin_nano")
    (root / "sys/class/thermal/thermal_zone5/temp").write_text("not-a-number\n")  # soc0
    cpu_temp = str(root / "sys/class/thermal/thermal_zone0/temp")
    real_open = os.open

    def flaky_open(path, flags, *a):
        if str(path) == cpu_temp:  # JetPack 6 cv*/power-gated zones answer EAGAIN
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", flaky_open)
    _, s = read_once(root)
    assert "cpu" not in s.temps_c and "soc0" not in s.temps_c and s.temps_c["gpu"] == 46.375
    assert "zone cpu: unreadable (Resource temporarily unavailable)" in s.notes
    assert any(n.startswith("zone soc0: unreadable (not an integer") for n in s.notes)


def test_throttle_flags_counters_and_cpu_load_between_reads(tree):
    root = tree("agx_orin")
    src, first = read_once(root)
    assert "cpu" not in first.load_pct  # one /proc/stat read: no interval yet
    (root / "sys/class/thermal/thermal_zone0/temp").write_text("99500\n")  # cpu past its passive trip
    (root / "sys/class/hwmon/hwmon3/oc2_event_cnt").write_text("3\n")
    # +1000 ticks, 250 of them idle -> 75 % busy
    (root / "proc/stat").write_text("cpu  26716876 25174 7198445 948399297 900582 0 354519 0 0 0\n")
    s = src.read()
    assert s.throttle["trip:cpu"] is True and s.throttle["trip:gpu"] is False
    assert s.throttle["oc2_event_cnt"] == 3
    assert s.load_pct["cpu"] == 75.0


def test_a_plain_linux_box_is_not_a_jetson(tmp_path):
    (tmp_path / "sys/class/thermal/thermal_zone0").mkdir(parents=True)
    (tmp_path / "sys/class/thermal/thermal_zone0/type").write_text("x86_pkg_temp\n")
    (tmp_path / "sys/class/thermal/thermal_zone0/temp").write_text("45000\n")
    with pytest.raises(SourceUnavailable, match="not a Jetson: no INA3221"):
        JetsonSysfs(tmp_path).open()
