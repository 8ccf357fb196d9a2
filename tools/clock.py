"""`now`: the local date and time."""

from __future__ import annotations

from datetime import datetime


def now() -> dict:
    """The current local date, time, weekday and timezone on this device."""
    t = datetime.now().astimezone()
    return {"iso": t.isoformat(timespec="seconds"), "weekday": t.strftime("%A"), "timezone": t.tzname()}
