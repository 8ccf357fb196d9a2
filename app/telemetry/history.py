"""A bounded ring of samples with downsampled tiers for long history.

Tier 0 keeps the last `raw_len` samples as read (15 min at 1 Hz by default). Each further tier
(period_s, maxlen) averages the incoming samples into one per period as they arrive (default:
10 s buckets for 2 h, 60 s buckets for 24 h), so memory stays bounded however long the console
runs. Averaging: numbers -> mean, caps -> min, throttle counters -> max, flags -> any.

Thread safety: one writer (the sampler thread) and any number of readers; every method takes
the lock and returns new lists (the samples themselves are immutable).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import deque

from app.telemetry.sample import Sample

DEFAULT_TIERS = ((10.0, 720), (60.0, 1440))


def average(samples: list[Sample]) -> Sample:
    """One sample standing for `samples` (non-empty, time-ordered)."""
    n = len(samples)
    last = samples[-1]

    def mean_of(attr: str, reduce=None) -> dict:
        acc: dict[str, list[float]] = {}
        for s in samples:
            for k, v in getattr(s, attr).items():
                acc.setdefault(k, []).append(v)
        return {k: (reduce(v) if reduce else round(sum(v) / len(v), 4)) for k, v in acc.items()}

    thr: dict = {}
    for s in samples:
        for k, v in s.throttle.items():
            if isinstance(v, bool):
                thr[k] = bool(thr.get(k, False)) or v
            else:
                thr[k] = max(int(thr.get(k, v)), v)
    powers = [s.power_w for s in samples if s.power_w is not None]
    notes: list[str] = []
    for s in samples:
        for x in s.notes:
            if x not in notes and len(notes) < 8:
                notes.append(x)
    return Sample(
        t_mono=sum(s.t_mono for s in samples) / n, t_wall=sum(s.t_wall for s in samples) / n,
        source=last.source, temps_c=mean_of("temps_c"), rails_w=mean_of("rails_w"),
        power_w=round(sum(powers) / len(powers), 4) if powers else None, power_scope=last.power_scope,
        clocks_mhz=mean_of("clocks_mhz"), caps_mhz=mean_of("caps_mhz", min), load_pct=mean_of("load_pct"),
        mem_mb=mean_of("mem_mb"), power_mode=last.power_mode, throttle=thr, notes=tuple(notes))


class _Tier:
    def __init__(self, period_s: float, maxlen: int):
        self.period_s = period_s
        self.ring: deque[Sample] = deque(maxlen=maxlen)
        self.bucket: list[Sample] = []

    def add(self, s: Sample) -> None:
        if self.bucket and s.t_mono - self.bucket[0].t_mono >= self.period_s:
            self.ring.append(average(self.bucket))
            self.bucket = []
        self.bucket.append(s)


class History:
    """Samples by time: raw ring plus downsampled tiers."""

    def __init__(self, raw_len: int = 900, tiers: tuple = DEFAULT_TIERS):
        if raw_len < 2:
            raise ValueError(f"History raw_len must be >= 2, got {raw_len}")
        self._raw: deque[Sample] = deque(maxlen=raw_len)
        self._tiers = [_Tier(p, m) for p, m in tiers]
        self._lock = threading.Lock()
        self.appended = 0

    def append(self, s: Sample) -> None:
        with self._lock:
            if self._raw and s.t_mono < self._raw[-1].t_mono:
                return  # out of order (a replayed trace restarting): keep time monotonic
            self._raw.append(s)
            for t in self._tiers:
                t.add(s)
            self.appended += 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._raw)

    def latest(self) -> Sample | None:
        with self._lock:
            return self._raw[-1] if self._raw else None

    def raw(self) -> list[Sample]:
        with self._lock:
            return list(self._raw)

    def window(self, t0: float, t1: float) -> list[Sample]:
        """Raw samples in [t0, t1] plus the nearest one on each side (for interpolating the edges).
        Where t0 is older than the raw ring, the finest tier covering it supplies the older part."""
        with self._lock:
            raw = list(self._raw)
            older: list[Sample] = []
            if raw and t0 < raw[0].t_mono:
                for t in self._tiers:
                    ring = [s for s in t.ring if s.t_mono < raw[0].t_mono]
                    older = ring
                    if ring and ring[0].t_mono <= t0:
                        break
        seq = older + raw
        ts = [s.t_mono for s in seq]
        lo = max(0, bisect_left(ts, t0) - 1)
        hi = min(len(seq), bisect_right(ts, t1) + 1)
        return seq[lo:hi]

    def series(self, span_s: float) -> list[Sample]:
        """The last span_s seconds at the finest resolution that covers them (for charts)."""
        with self._lock:
            raw = list(self._raw)
            if not raw:
                return []
            end = raw[-1].t_mono
            if raw[0].t_mono <= end - span_s or not self._tiers:
                return [s for s in raw if s.t_mono >= end - span_s]
            for t in self._tiers:
                ring = list(t.ring)
                if ring and ring[0].t_mono <= end - span_s:
                    break
            return [s for s in ring if s.t_mono >= end - span_s and s.t_mono < raw[0].t_mono] + raw
