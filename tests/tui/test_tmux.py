"""Smoke test of the real `kvdeck` command in a tmux pane at 80×24: load, one message, the
Prompt tab shows the call's cached / computed figures; Ctrl+Q quits."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KVDECK = ROOT / ".venv" / "bin" / "kvdeck"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def _capture(name: str) -> str:
    return _tmux("capture-pane", "-p", "-t", name)


def _alive(name: str) -> bool:
    return subprocess.run(["tmux", "has-session", "-t", name], capture_output=True).returncode == 0


def _wait(name: str, pattern: str, timeout: float) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        screen = _capture(name)
        if re.search(pattern, screen):
            return screen
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} not on screen after {timeout:.0f} s:\n{_capture(name)}")


def test_kvdeck_in_tmux_shows_cached_and_computed(tmp_path):
    name = f"kvdeck-{uuid.uuid4().hex[:8]}"
    chat = screen = ""
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "KVDECK_CONFIG": str(tmp_path / "none.toml"), "TERM": "xterm-256color"}
    exports = " ".join(f"{k}={v}" for k, v in env.items())
    cmd = f"cd {ROOT} && env {exports} {KVDECK} --max-tokens 8 --tool-choice none"
    _tmux("new-session", "-d", "-s", name, "-x", "80", "-y", "24", cmd)
    try:
        _wait(name, r"ready", timeout=180)
        _tmux("send-keys", "-t", name, "Say hello.", "Enter")
        chat = _wait(name, r"ready · 2 calls", timeout=180)
        _tmux("send-keys", "-t", name, "F6")
        screen = _wait(name, r"cached", timeout=10)
        row = re.search(r"[│ ]1\.1\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)%", screen)
        assert row, f"no ledger row for call 1.1:\n{screen}"
        prompt, cached, computed = (int(row.group(i)) for i in (1, 2, 3))
        assert cached > 0 and cached + computed == prompt, screen
        _tmux("send-keys", "-t", name, "C-q")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15 and _alive(name):
            time.sleep(0.3)
        assert not _alive(name), "Ctrl+Q quits the console"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        if os.environ.get("KVDECK_TMUX_KEEP"):
            print(chat, screen, sep="\n")
