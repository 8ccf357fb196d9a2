"""`kvdeck telemetry`: --json lines, --record and the recorded source playing the trace back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.telemetry import load_trace, summarize_call, to_event
from app.telemetry.cli import main

FIX = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]


def test_cli_count_2_json_through_kvdeck(tmp_path):
    r = subprocess.run([sys.executable, "-m", "app", "telemetry", "--count", "2", "--json", "--interval", "0.2"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 2 and lines[0]["source"] == lines[1]["source"] != ""
    assert lines[1]["t_mono"] > lines[0]["t_mono"]
    for d in lines:
        assert set(d) >= {"temps_c", "rails_w", "power_w", "power_scope", "clocks_mhz", "load_pct", "mem_mb"}


def test_off_jetson_psutil_line_says_board_power_is_unavailable(capsys):
    assert main(["--source", "psutil", "--count", "2", "--interval", "0.1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# source: psutil (board power unavailable: no power sensor this source can read)"
    assert len(out) == 3 and all("  psutil  board power: unavailable  cpu " in x for x in out[1:])
    assert " ram " in out[2]


def test_record_then_play_back_round_trip(tmp_path, capsys):
    trace = tmp_path / "nano.jsonl"
    assert main(["--source", "jetson-sysfs", "--sysfs-root", str(FIX / "orin_nano"), "--count", "3",
                 "--interval", "0.05", "--record", str(trace), "--json"]) == 0
    recorded = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [json.loads(x) for x in trace.read_text().splitlines()] == recorded
    assert main(["--source", "recorded", "--trace", str(trace), "--count", "5", "--json", "--interval", "0.02"]) == 0
    cap = capsys.readouterr()
    played = [json.loads(x) for x in cap.out.splitlines()]
    assert len(played) == 3 and f"trace {trace} ended after 3 samples" in cap.err  # ends, not loops
    for a, b in zip(recorded, played):
        assert b["source"] == "recorded:jetson-sysfs"
        assert {k: v for k, v in a.items() if k not in ("source", "t_mono")} == \
               {k: v for k, v in b.items() if k not in ("source", "t_mono")}
    # spacing kept, moved onto this process's monotonic clock
    assert played[2]["t_mono"] - played[0]["t_mono"] == pytest.approx(recorded[2]["t_mono"] - recorded[0]["t_mono"])


def test_bad_trace_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t_mono": 1, "t_wall": 2, "temps_c": {"tj": 40}}\n{"t_mono": 2, "t_wall": 3, "power_w": "hot"}\n')
    assert main(["--source", "recorded", "--trace", str(bad), "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: field 'power_w' must be a number or null, got 'hot'" in err
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not JSON"):
        bad.write_text("{oops\n")
        load_trace(bad)


def test_recorded_trace_gives_a_call_summary_and_an_event(tmp_path, capsys):
    trace = tmp_path / "agx.jsonl"
    main(["--source", "jetson-sysfs", "--sysfs-root", str(FIX / "agx_orin"), "--count", "3", "--interval", "0.05",
          "--record", str(trace), "--json"])
    samples = load_trace(trace)
    c = summarize_call(samples, samples[0].t_mono, samples[-1].t_mono, tokens=70)
    span = samples[-1].t_mono - samples[0].t_mono
    assert c.mean_power_w == pytest.approx(6.9938, abs=1e-3) and c.energy_j == pytest.approx(6.9938 * span, rel=1e-3)
    assert c.power_scope == "sum of rails" and c.temps_c["tj"] == {"min": 41.66, "max": 41.66, "mean": 41.66}
    ev = to_event(samples[0])
    assert type(ev).__name__ == "TelemetrySample" and ev.source == "jetson-sysfs"
    assert ev.values["rails_w"]["VDD_GPU_SOC"] == 2.3875 and "t_mono" not in ev.values


def test_panel_reading_does_not_double_count_vdd_in():
    from app.telemetry import panel_dict
    from app.telemetry.jetson_sysfs import JetsonSysfs

    nano = JetsonSysfs(FIX / "orin_nano")
    nano.open()
    d = panel_dict(nano.read())
    assert d["power_w"] == {"VDD_IN": 5.0843} and d["unavailable"] == "" and d["gpu_pct"] == 12.0
    agx = JetsonSysfs(FIX / "agx_orin")
    agx.open()
    assert sum(panel_dict(agx.read())["power_w"].values()) == pytest.approx(6.9938, abs=1e-4)
    assert panel_dict(None)["unavailable"] == "telemetry: no reading yet"


def test_trace_from_the_environment_is_last_in_the_chain(monkeypatch):
    from app.telemetry import default_chain, make_source

    monkeypatch.setenv("KVDECK_TELEMETRY_TRACE", str(REPO / "assets/telemetry/h200_nvml_generate.jsonl"))
    assert default_chain() == ["jtop", "jetson-sysfs", "nvml", "psutil", "recorded"]
    src = make_source("recorded")
    src.open()
    assert src.read().source == "recorded:nvml"
    monkeypatch.delenv("KVDECK_TELEMETRY_TRACE")
    assert default_chain()[-1] == "psutil"
    with pytest.raises(ValueError, match="source 'recorded' needs a trace file"):
        make_source("recorded")
