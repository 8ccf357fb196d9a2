"""`kvdeck bench cpu`: the shape of our side's output, a missing peer reported, the load helpers.

None of these needs llama.cpp: the peer is made absent (peer.load_llama_cpp -> None) so the
tests behave the same where llama-cpp-python is installed. The --quick runs take seconds.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from app.bench import cli, cpu, peer
from app.bench.load import BusyLoad
from app.bench.weightbytes import gguf_weight_bytes, kvdeck_weight_bytes

HIDDEN, VOCAB = 576, 49152   # SmolLM2-135M


@pytest.fixture
def no_peer(monkeypatch):
    monkeypatch.setattr(peer, "load_llama_cpp", lambda: None)


def _json_run(capsys, argv: list[str]) -> dict:
    assert cpu.run(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_quick_json_has_every_figure_of_ours_and_names_the_missing_peer(root, no_peer, capsys):
    out = _json_run(capsys, ["--quick"])
    assert "llama-cpp-python is not installed" in out["llama_cpp"]["missing"]
    assert "pip install" in out["llama_cpp"]["missing"]
    figs = out["plan"]["figures"]
    assert figs == ["prefill_128", "decode_32"]
    ours = out["kvdeck"]["nvfp4"]
    for f in figs:
        assert ours[f] > 1.0, f"{f}: {ours[f]} tok/s"
    assert "ratio_to_llama_q4_0_best" not in ours   # no peer, no ratio
    wb = ours["weight_bytes"]
    assert wb["total"] == wb["head"] + wb["layers"] + wb["embed_row"]
    # one embedding row: int8 codes + an f16 scale per 32 (the default 8-bit table), or f16
    assert wb["embed_row"] in (HIDDEN + HIDDEN // 32 * 2, HIDDEN * 2)
    head_bytes = {"nvfp4": VOCAB * HIDDEN // 2 + VOCAB * HIDDEN // 16 + 4,   # codes + E4M3 scales + tscale
                  "w8a8": VOCAB * HIDDEN + VOCAB * HIDDEN // 32 * 2}           # int8 codes + f16 scales
    assert wb["head"] == head_bytes[wb["head_kind"].split(",")[0]]  # "w8a8, tied embedding": one table
    assert out["copy_bandwidth_gb_s"] > 0.1
    assert out["cpu_use"]["self_cores"] > 0.1 and out["cpu_use"]["others_cores"] >= 0.0
    assert out["cpu"]["cores"] == os.cpu_count()


def test_quick_table_prints_flags_bandwidth_bytes_and_the_missing_peer(root, no_peer, capsys):
    assert cpu.run(["--quick"]) == 0
    text = capsys.readouterr().out
    assert "llama.cpp peer: llama-cpp-python is not installed" in text
    assert peer.INSTALL_HINT in text
    assert "flags:" in text and "memory copy bandwidth:" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("kvdeck nvfp4") and "MB" in ln)
    assert "head 15.9 MB (nvfp4)" in line or "head 30.1 MB (w8a8" in line
    row = next(ln for ln in text.splitlines() if ln.startswith("kvdeck nvfp4 ["))
    assert len(row.split("]", 1)[1].split()) == 2            # one tok/s cell per figure, no ratios
    assert "prefill 128" in text and "decode@32" in text


def test_weight_bytes_tied_heads_count_the_whole_table(root):
    f16 = kvdeck_weight_bytes(root / "f16")
    assert f16.head_kind == "F16, tied embedding" and f16.head == VOCAB * HIDDEN * 2
    gguf = peer.gguf_dir() / peer.GGUF_Q41
    if not gguf.is_file():
        pytest.fail(f"{gguf}: missing; run `kvdeck models fetch smollm2-135m`")
    wb = gguf_weight_bytes(gguf)
    assert wb.head_kind == "Q8_0, tied embedding"
    assert wb.head == VOCAB * HIDDEN // 32 * 34 and wb.embed_row == HIDDEN // 32 * 34


def test_load_levels_always_include_idle():
    assert cpu._levels("2") == [0, 2]
    assert cpu._levels("0,1,2") == [0, 1, 2]
    for bad in ("x", "-1", ""):
        with pytest.raises(SystemExit):
            cpu._levels(bad)


def test_busy_processes_spin_are_killed_and_end_by_themselves():
    with BusyLoad(1, max_s=30) as busy:
        (pid,) = busy.pids()
        assert busy.all_alive()
    with pytest.raises(ProcessLookupError):   # killed and reaped at exit
        os.kill(pid, 0)
    with BusyLoad(1, max_s=0.3) as busy:      # a bounded lifetime even if never killed
        time.sleep(0.8)
        assert not busy.all_alive()


def test_quick_load_mode_reports_idle_and_loaded_rows(root, no_peer, capsys):
    out = _json_run(capsys, ["--quick", "--load", "1"])
    rows = out["load"]["rows"]
    assert [r["busy"] for r in rows] == [0, 1]
    assert rows[0]["kvdeck_ratio"] == 1.0 and rows[1]["kvdeck"] > 0
    assert rows[0]["cpu_use"]["busy_children_cores"] == 0.0
    assert rows[1]["cpu_use"]["busy_children_cores"] > 0.1     # the busy process really ran beside
    assert "missing" in out["llama_cpp"]


def test_cli_rejects_an_unknown_bench(capsys):
    assert cli.main(["nope"]) == 2
    assert "cpu" in capsys.readouterr().err


def test_decode_ctx_option_adds_the_long_context_figure_and_rejects_bad_counts(root, no_peer, capsys):
    out = _json_run(capsys, ["--quick", "--decode-ctx", "40,8"])
    # the prefill figures stay; the decode figures follow the option, sorted
    assert out["plan"]["decode_ctx"] == [8, 40]
    assert [f for f in out["plan"]["figures"] if f.startswith("decode")] == ["decode_8", "decode_40"]
    assert out["kvdeck"]["nvfp4"]["decode_40"] > 1.0
    for bad in ("0", "x,32", ""):
        with pytest.raises(SystemExit) as e:
            cpu.run(["--decode-ctx", bad, "--no-peer"])
        assert "--decode-ctx" in str(e.value) or e.value.code == 2


def test_probe_names_a_peer_that_dies_by_a_signal(tmp_path, monkeypatch):
    """A llama.cpp build that crashes (AMX on a KVM guest) is found in a child process, not by
    the bench dying: the probe names the signal, the file and the rebuild without AMX."""
    crash = tmp_path / "python"
    crash.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crash.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(crash))
    why = peer.probe(tmp_path / "model.Q4_0.gguf", threads=2)
    assert why and "signal 11" in why and "model.Q4_0.gguf" in why and "-mno-amx-int8" in why
    ok = tmp_path / "ok"
    ok.write_text("#!/bin/sh\nexit 0\n")
    ok.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(ok))
    assert peer.probe(tmp_path / "model.Q4_0.gguf", threads=2) is None


def test_a_crashing_peer_is_skipped_with_its_reason(root, monkeypatch, capsys):
    monkeypatch.setattr(peer, "load_llama_cpp", lambda: object())
    monkeypatch.setattr(peer, "ensure_q4_0", lambda lc, src, dst, threads: src)
    monkeypatch.setattr(peer, "probe", lambda path, threads: f"llama.cpp died (signal 11) on {path.name}")
    gguf = peer.gguf_dir() / peer.GGUF_Q41
    if not gguf.is_file():
        pytest.fail(f"{gguf}: missing; run `kvdeck models fetch smollm2-135m`")
    assert cpu.run(["--quick"]) == 0
    text = capsys.readouterr().out
    assert f"llama.cpp peer: llama.cpp died (signal 11) on {peer.GGUF_Q41}; peer skipped" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("kvdeck nvfp4 ["))
    assert len(row.split("]", 1)[1].split()) == 2            # our figures, no ratios
