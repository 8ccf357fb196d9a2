"""Telemetry: the board's thermals, power and clocks; energy per engine call; throttle marks.

Sources, the first that works wins (sources.ORDER): jtop (jetson-stats, optional, imported only in
jtop_source.py) -> jetson-sysfs (our own reader of thermal zones, INA3221 rails, GPU devfreq,
cpufreq, nvpmodel, OC event counters) -> nvml (nvidia-ml-py, optional) -> psutil -> a recorded
JSON-lines trace when one is configured.

How the composition root (app/__main__.py) and the store wire it:

    from app.telemetry import Sampler
    sampler = Sampler(interval=1.0, on_sample=...).start()   # daemon thread, 1 Hz
    ...
    # after each engine call, with t0 = EngineCallStarted.t_mono, t1 = EngineCallFinished.t_mono:
    tel = sampler.summarize(t0, t1, tokens=stats.computed_tokens + stats.decode_tokens)
    event = dataclasses.replace(finished, telemetry=tel.as_dict())
    ...
    sampler.stop()                                            # joins the thread

    # or, over any history / list of samples (e.g. a recorded trace):
    summarize_call(history_or_samples, t0, t1, tokens) -> CallTelemetry

`panel_dict(sample, sampler)` is the console thermal panel's reading (app/tui/widgets/power.py).
`to_event(sample)` wraps a Sample into app.events.TelemetrySample(source, values).
This package never imports the agent, the TUI or textual.
"""

from __future__ import annotations

from app.telemetry.energy import CallTelemetry, summarize_call
from app.telemetry.history import History
from app.telemetry.panel import panel_dict
from app.telemetry.recorded import RecordedSource, TraceWriter, load_trace
from app.telemetry.sample import Sample, Source, SourceUnavailable
from app.telemetry.sampler import Sampler
from app.telemetry.sources import NAMES, ORDER, default_chain, make_source, open_first


def to_event(sample: Sample, session_id: str = ""):
    """The TelemetrySample event for a reading (app.events owns the event classes)."""
    from app.events import TelemetrySample

    kw = {"session_id": session_id} if session_id and "session_id" in TelemetrySample.__dataclass_fields__ else {}
    return TelemetrySample(source=sample.source, values=sample.values(), **kw)


__all__ = [
    "CallTelemetry", "History", "NAMES", "ORDER", "RecordedSource", "Sample", "Sampler", "Source",
    "SourceUnavailable", "TraceWriter", "default_chain", "load_trace", "make_source", "open_first",
    "panel_dict", "summarize_call", "to_event",
]
