"""Test helpers: the text a widget shows, and waiting on the app without sleeping blindly."""

from __future__ import annotations

import time

from textual.geometry import Region


def shown(widget) -> str:
    """The plain text the widget draws now (its lines, as on screen)."""
    w, h = widget.size
    return "\n".join(s.text for s in widget.render_lines(Region(0, 0, w, h)))


async def wait_for(pilot, cond, timeout: float = 60.0, step: float = 0.1) -> float:
    """Pause the pilot until cond() is true; returns the seconds it took; fails after timeout."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout:.0f} s")
        await pilot.pause(step)
    return time.monotonic() - t0
