"""Snapshots of the console on the recorded session (tests/tui/data/session.jsonl): no engine,
no clock text (times are the recording's, printed in UTC), the recorded telemetry reading.

Update after an intended change: .venv/bin/python -m pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

from app.tui.screenshots import recorded_app


def test_main_screen_80x24(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=(80, 24))


def test_main_screen_80x24_prompt_tab(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=(80, 24), press=["f6"])


def test_main_screen_160x48(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=(160, 48))


def test_cache_inspector(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=(120, 36), press=["f3", "down", "down"])


def test_help_screen(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=(80, 24), press=["f1"])
