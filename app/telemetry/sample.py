"""One telemetry reading (`Sample`) and the `Source` protocol every reader implements.

Units are fixed here, whatever the source reports natively: temperatures in °C, power in W,
clocks in MHz, loads in %, memory in MB. A value a source cannot read is absent from its dict
(never 0); why it is absent goes into `notes`.

Ownership: a `Sample` is created by one `Source.read()` call and never mutated afterwards (its
dicts are fresh per reading; treat them as read-only). The sampler thread, the history ring and
the console all share the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

TRACE_VERSION = 1  # the "v" of a recorded JSON-lines trace


class SourceUnavailable(Exception):
    """A source cannot be opened or has stopped working; the message says why, for the user."""


@dataclass(frozen=True)
class Sample:
    """One reading from one source.

    t_mono / t_wall: time.monotonic() / time.time() when it was read.
    temps_c: zone or sensor name -> °C (offline or error zones are left out, with a note).
    rails_w: power rail -> W.  power_w: the board (or GPU) total in W, None when the source has no
    power sensor; power_scope says what that total covers ("VDD_IN", "sum of rails", "GPU (NVML)").
    clocks_mhz: unit -> current clock; caps_mhz: unit -> the current upper limit of that clock.
    load_pct: unit -> utilisation %.  mem_mb: "ram_used", "ram_total", "gpu_used", "gpu_total".
    power_mode: the nvpmodel mode ("15W (id 0)"), "" where there is none.
    throttle: int values are cumulative event counters (a rise means an event happened),
    bool values are flags (True = throttling now).
    """

    t_mono: float
    t_wall: float
    source: str
    temps_c: dict = field(default_factory=dict)
    rails_w: dict = field(default_factory=dict)
    power_w: float | None = None
    power_scope: str = ""
    clocks_mhz: dict = field(default_factory=dict)
    caps_mhz: dict = field(default_factory=dict)
    load_pct: dict = field(default_factory=dict)
    mem_mb: dict = field(default_factory=dict)
    power_mode: str = ""
    throttle: dict = field(default_factory=dict)
    notes: tuple = ()

    def as_dict(self) -> dict:
        """JSON-ready form (also one line of a recorded trace)."""
        return {
            "v": TRACE_VERSION, "t_mono": self.t_mono, "t_wall": self.t_wall, "source": self.source,
            "temps_c": dict(self.temps_c), "rails_w": dict(self.rails_w), "power_w": self.power_w,
            "power_scope": self.power_scope, "clocks_mhz": dict(self.clocks_mhz),
            "caps_mhz": dict(self.caps_mhz), "load_pct": dict(self.load_pct), "mem_mb": dict(self.mem_mb),
            "power_mode": self.power_mode, "throttle": dict(self.throttle), "notes": list(self.notes),
        }

    def values(self) -> dict:
        """as_dict() without the times and the source: the `values` of a TelemetrySample event."""
        d = self.as_dict()
        for k in ("v", "t_mono", "t_wall", "source"):
            d.pop(k)
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "sample") -> Sample:
        """Parse as_dict() output; a bad field raises ValueError naming `where` and the field."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("v", TRACE_VERSION) != TRACE_VERSION:
            raise ValueError(f"{where}: trace version {d.get('v')!r}, this kvdeck reads {TRACE_VERSION}")
        for k in ("t_mono", "t_wall"):
            if not isinstance(d.get(k), (int, float)) or isinstance(d.get(k), bool):
                raise ValueError(f"{where}: field {k!r} must be a number, got {d.get(k)!r}")
        kw = {}
        for k in ("temps_c", "rails_w", "clocks_mhz", "caps_mhz", "load_pct", "mem_mb"):
            v = d.get(k, {})
            if not isinstance(v, dict) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   for x in v.values()):
                raise ValueError(f"{where}: field {k!r} must map names to numbers, got {v!r}")
            kw[k] = {str(n): float(x) for n, x in v.items()}
        thr = d.get("throttle", {})
        if not isinstance(thr, dict) or not all(isinstance(x, (int, bool)) for x in thr.values()):
            raise ValueError(f"{where}: field 'throttle' must map names to integers or booleans, got {thr!r}")
        pw = d.get("power_w")
        if pw is not None and (not isinstance(pw, (int, float)) or isinstance(pw, bool)):
            raise ValueError(f"{where}: field 'power_w' must be a number or null, got {pw!r}")
        return cls(t_mono=float(d["t_mono"]), t_wall=float(d["t_wall"]), source=str(d.get("source", "")),
                   power_w=None if pw is None else float(pw), power_scope=str(d.get("power_scope", "")),
                   power_mode=str(d.get("power_mode", "")), throttle=dict(thr),
                   notes=tuple(str(n) for n in d.get("notes", ())), **kw)

    def shifted(self, dt: float, source: str | None = None) -> Sample:
        """A copy with t_mono moved by dt (a replayed trace lives on the current clock)."""
        return replace(self, t_mono=self.t_mono + dt, source=self.source if source is None else source)


@runtime_checkable
class Source(Protocol):
    """A telemetry reader. Owned by one thread at a time (the sampler's).

    open(): acquire what it needs; raises SourceUnavailable(reason) when it cannot work here.
    read(): one Sample; raises SourceUnavailable (or any exception) when it stopped working.
    close(): release; safe to call twice and after a failed open().
    """

    name: str

    def open(self) -> None: ...

    def read(self) -> Sample: ...

    def close(self) -> None: ...
