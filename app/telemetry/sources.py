"""Which source to use: the fallback order, and opening the first one that works.

Order: jtop, jetson-sysfs, nvml, psutil, then a recorded trace if one is configured (a trace is
never played silently in place of live readings: it is only in the chain when given, and its
samples are named "recorded:..."). "Works" means open() succeeded AND a first read() returned.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from app.telemetry.sample import Sample, Source, SourceUnavailable

ORDER = ("jtop", "jetson-sysfs", "nvml", "psutil")
NAMES = ORDER + ("recorded",)


def make_source(name: str, trace: str | None = None, sysfs_root: str = "/", interval: float = 1.0) -> Source:
    """A fresh, unopened Source by name (see NAMES). ValueError names a bad name or missing trace."""
    if name == "jtop":
        from app.telemetry.jtop_source import JtopSource

        return JtopSource(interval=interval)
    if name == "jetson-sysfs":
        from app.telemetry.jetson_sysfs import JetsonSysfs

        return JetsonSysfs(root=sysfs_root)
    if name == "nvml":
        from app.telemetry.nvml import NvmlSource

        return NvmlSource()
    if name == "psutil":
        from app.telemetry.host import PsutilSource

        return PsutilSource()
    if name == "recorded":
        trace = trace or os.environ.get("KVDECK_TELEMETRY_TRACE")
        if not trace:
            raise ValueError("source 'recorded' needs a trace file (--trace FILE or KVDECK_TELEMETRY_TRACE)")
        from app.telemetry.recorded import RecordedSource

        return RecordedSource(trace)
    raise ValueError(f"unknown telemetry source {name!r}; choose one of: {', '.join(NAMES)}")


def default_chain(trace: str | None = None) -> list[str]:
    """ORDER, plus "recorded" when a trace is given or KVDECK_TELEMETRY_TRACE is set."""
    trace = trace or os.environ.get("KVDECK_TELEMETRY_TRACE")
    return list(ORDER) + (["recorded"] if trace else [])


def open_first(names: Sequence[str], factory: Callable[[str], Source]) -> tuple[Source | None, Sample | None, list[str]]:
    """Open names in order with factory(name); return (source, its first sample, notes).

    notes has one line per source that did not work ("nvml: nvidia-ml-py is not installed ...").
    Returns (None, None, notes) when none works. Never raises for a source's failure.
    """
    notes: list[str] = []
    for name in names:
        try:
            src = factory(name)
        except ValueError as e:
            notes.append(f"{name}: {e}")
            continue
        try:
            src.open()
            first = src.read()
        except SourceUnavailable as e:
            notes.append(f"{name}: {e}")
            _close(src)
            continue
        except Exception as e:  # a source's bug must not stop the fallback
            notes.append(f"{name}: failed ({type(e).__name__}: {e})")
            _close(src)
            continue
        return src, first, notes
    return None, None, notes


def _close(src: Source) -> None:
    try:
        src.close()
    except Exception:
        pass
