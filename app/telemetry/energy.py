"""Per engine call telemetry: temperatures, power, energy, tokens per joule, throttle mark.

    summarize_call(history, t0, t1, tokens) -> CallTelemetry

history: a History (its window(t0, t1) is used) or any time-ordered sequence of Samples.
t0, t1: time.monotonic() at the call's start and end (EngineCallStarted.t_mono and
EngineCallFinished.t_mono). tokens: the tokens the call processed (the composition root passes
computed prompt tokens + decode tokens, the work the energy paid for).

Each quantity is a piecewise-linear curve through the samples, clipped to [t0, t1]: a sample on
each side of an edge is interpolated at the edge; with none on one side the nearest value is
held (and `held_s` says for how long, so a caller can tell a measured edge from a held one).
energy_j = trapezoid integral of power over [t0, t1]; mean_power_w = energy_j / (t1 - t0);
peak_power_w = the highest point of the curve in [t0, t1]. Temperatures: min / max / time-weighted
mean of each zone's curve. Throttle mark: a throttle counter rose, a throttle flag was set, a
clock cap fell, or a busy unit's (load >= 50 %) clock fell below 85 % of its value at t0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from app.telemetry.sample import Sample

CLOCK_DROP = 0.85  # a busy unit below this fraction of its starting clock counts as throttled
BUSY_PCT = 50.0


@dataclass(frozen=True)
class CallTelemetry:
    """Telemetry of one engine call (values rounded for display / storage; None = not measured)."""

    t0: float
    t1: float
    source: str
    samples: int  # samples inside [t0, t1]
    temps_c: dict = field(default_factory=dict)  # zone -> {"min", "max", "mean"}
    mean_power_w: float | None = None
    peak_power_w: float | None = None
    energy_j: float | None = None
    power_scope: str = ""
    tokens: int = 0
    tokens_per_j: float | None = None
    held_s: float = 0.0  # seconds of [t0, t1] covered by holding the nearest value, not interpolating
    throttled: bool = False
    throttle_reasons: tuple = ()

    def as_dict(self) -> dict:
        d = asdict(self)
        d["throttle_reasons"] = list(self.throttle_reasons)
        return d


# ---------------------------------------------------------------------------------------------
# Piecewise-linear curves clipped to [t0, t1]
# ---------------------------------------------------------------------------------------------

def _clip(points: list[tuple[float, float]], t0: float, t1: float) -> tuple[list[tuple[float, float]], float]:
    """The knots of the curve through `points` (time-ordered) restricted to [t0, t1], and the
    seconds at the edges covered by holding the nearest value."""
    if not points:
        return [], 0.0

    def at(t: float) -> float:
        for (ta, va), (tb, vb) in zip(points, points[1:]):
            if ta <= t <= tb:
                return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)
        return points[0][1] if t < points[0][0] else points[-1][1]

    held = max(0.0, min(points[0][0], t1) - t0) + max(0.0, t1 - max(points[-1][0], t0))
    knots = [(t0, at(t0))] + [(t, v) for t, v in points if t0 < t < t1] + [(t1, at(t1))]
    return knots, min(held, t1 - t0)


def _integral(knots: list[tuple[float, float]]) -> float:
    return sum((tb - ta) * (va + vb) / 2.0 for (ta, va), (tb, vb) in zip(knots, knots[1:]))


def _at_or_before(samples: Sequence[Sample], t: float) -> Sample:
    best = samples[0]
    for s in samples:
        if s.t_mono <= t:
            best = s
    return best


# ---------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------

def summarize_call(history, t0: float, t1: float, tokens: int) -> CallTelemetry:
    """See the module docstring. Never raises for missing data: what cannot be measured is None."""
    if t1 < t0:
        raise ValueError(f"summarize_call: t1 ({t1}) is before t0 ({t0})")
    seq = history.window(t0, t1) if hasattr(history, "window") else \
        sorted((s for s in history), key=lambda s: s.t_mono)
    inside = [s for s in seq if t0 <= s.t_mono <= t1]
    if not seq:
        return CallTelemetry(t0=t0, t1=t1, source="", samples=0, tokens=tokens)
    dur = t1 - t0
    # Power and energy.
    pts = [(s.t_mono, s.power_w) for s in seq if s.power_w is not None]
    mean_p = peak_p = energy = tpj = None
    held = 0.0
    if pts:
        knots, held = _clip(pts, t0, t1)
        energy = _integral(knots)
        peak_p = max(v for _, v in knots)
        mean_p = energy / dur if dur > 0 else knots[0][1]
        if energy > 0:
            tpj = tokens / energy
    # Temperatures.
    temps = {}
    for zone in sorted({z for s in seq for z in s.temps_c}):
        zp = [(s.t_mono, s.temps_c[zone]) for s in seq if zone in s.temps_c]
        knots, _ = _clip(zp, t0, t1)
        vals = [v for _, v in knots]
        mean = _integral(knots) / dur if dur > 0 else vals[0]
        temps[zone] = {"min": round(min(vals), 2), "max": round(max(vals), 2), "mean": round(mean, 2)}
    reasons = _throttle(seq, t0, t1)
    scope = next((s.power_scope for s in reversed(seq) if s.power_scope), "")
    return CallTelemetry(
        t0=t0, t1=t1, source=seq[-1].source, samples=len(inside), temps_c=temps,
        mean_power_w=_r(mean_p, 3), peak_power_w=_r(peak_p, 3), energy_j=_r(energy, 4), power_scope=scope,
        tokens=tokens, tokens_per_j=_r(tpj, 3), held_s=round(held, 3), throttled=bool(reasons),
        throttle_reasons=tuple(reasons))


def _throttle(seq: Sequence[Sample], t0: float, t1: float) -> list[str]:
    start = _at_or_before(seq, t0)
    during = [s for s in seq if t0 < s.t_mono <= t1] or [start]
    # The sample after t1 (if any) shows the state the call ended in; include it for counters only.
    after = [s for s in seq if s.t_mono > t1][:1]
    reasons: list[str] = []
    for k, v0 in start.throttle.items():
        if isinstance(v0, bool):
            continue
        top = max((s.throttle[k] for s in during + after if k in s.throttle), default=v0)
        if top > v0:
            reasons.append(f"{k} +{top - v0}")
    for k in sorted({k for s in during for k, v in s.throttle.items() if v is True}):
        reasons.append(f"{k} {'rose' if start.throttle.get(k) is False else 'set'}")
    for unit, cap0 in start.caps_mhz.items():
        low = min((s.caps_mhz[unit] for s in during if unit in s.caps_mhz), default=cap0)
        if low < cap0:
            reasons.append(f"{unit} clock cap {cap0:g} -> {low:g} MHz")
    for unit, c0 in start.clocks_mhz.items():
        for s in during:
            c, busy = s.clocks_mhz.get(unit), s.load_pct.get(unit, 0.0)
            if c is not None and busy >= BUSY_PCT and c < CLOCK_DROP * c0:
                reasons.append(f"{unit} clock {c0:g} -> {c:g} MHz at {busy:g}% load")
                break
    return reasons


def _r(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)
