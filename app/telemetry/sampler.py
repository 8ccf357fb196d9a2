"""The sampler: a daemon thread reading the chosen source every `interval` seconds into a History.

Lifecycle: Sampler(...).start() -> the thread opens the first working source of `chain` (see
sources.open_first) and then reads it at 1 Hz (default). A source that fails mid-run is closed
and the next one in the chain is opened; each switch adds a line to `notes`. Nothing a source
raises ever leaves the thread. stop() ends the thread and joins it.

request_sample() asks for a reading now (the composition root does this at an engine call's end
so the call's last edge is measured, not held) and waits briefly for it.

Cost: the thread measures its own CPU time with time.thread_time(); cost_pct() is that time as
a % of one core over the thread's wall time (target: <= 1 % at 1 Hz).

Threads: the sampler thread is the only one touching the Source; callbacks (on_sample) run on
it and must be quick; everything else here is safe from any thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from app.telemetry.energy import CallTelemetry, summarize_call
from app.telemetry.history import History
from app.telemetry.sample import Sample, Source, SourceUnavailable
from app.telemetry.sources import default_chain, make_source, open_first


class Sampler:
    """Background telemetry. Owns its Source and its thread; shares `history` read-only."""

    def __init__(self, interval: float = 1.0, chain: Sequence[str] | None = None,
                 factory: Callable[[str], Source] | None = None, history: History | None = None,
                 on_sample: Callable[[Sample], None] | None = None, trace: str | None = None,
                 sysfs_root: str = "/"):
        if not interval > 0:
            raise ValueError(f"telemetry interval must be > 0 seconds, got {interval}")
        self.interval = float(interval)
        self.chain = list(chain) if chain is not None else default_chain(trace)
        self._factory = factory or (lambda n: make_source(n, trace=trace, sysfs_root=sysfs_root, interval=interval))
        self.history = history if history is not None else History()
        self.on_sample = on_sample
        self.notes: deque[str] = deque(maxlen=50)
        self.source_name = ""  # "" until a source works; "none" when every source failed
        self._src: Source | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._new = threading.Condition()
        self._thread: threading.Thread | None = None
        self._cpu_s = 0.0
        self._wall0 = 0.0
        self._wall_s = 0.0
        self.open_cpu_s = 0.0  # CPU spent opening the first source (imports, discovery, first read)
        self._open_wall_s = 0.0
        self.notes_total = 0  # notes ever added (the deque keeps the last 50)
        self.reads = 0

    # -- control ---------------------------------------------------------------------------

    def start(self) -> Sampler:
        if self._thread is not None:
            raise RuntimeError("Sampler already started")
        self._thread = threading.Thread(target=self._run, name="kvdeck-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def request_sample(self, wait: float = 0.5) -> Sample | None:
        """Wake the thread for a reading now; return it (or None if none came within `wait` s)."""
        n = self.history.appended
        self._wake.set()
        deadline = time.monotonic() + wait
        with self._new:
            while self.history.appended == n and self.running:
                left = deadline - time.monotonic()
                if left <= 0 or not self._new.wait(left):
                    return None
        return self.history.latest()

    def summarize(self, t0: float, t1: float, tokens: int, fresh: bool = True) -> CallTelemetry:
        """summarize_call over this sampler's history; with fresh, first take a reading at t1
        when the latest one is older (so the call's end is interpolated, not held)."""
        last = self.history.latest()
        if fresh and self.running and (last is None or last.t_mono < t1):
            self.request_sample()
        return summarize_call(self.history, t0, t1, tokens)

    def cost_pct(self) -> float:
        """Steady-state cost: the thread's CPU time after opening its first source, as % of one
        core over the wall time since then (opening is one-off: see open_cpu_s)."""
        wall = (self._wall_s if not self.running else time.monotonic() - self._wall0) - self._open_wall_s
        return 100.0 * (self._cpu_s - self.open_cpu_s) / wall if wall > 0 else 0.0

    @property
    def wall_s(self) -> float:
        return self._wall_s if not self.running else time.monotonic() - self._wall0

    @property
    def cpu_s(self) -> float:
        return self._cpu_s

    # -- the thread ------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        self.notes.append(text)
        self.notes_total += 1

    def _open_from(self, names: Sequence[str]) -> Sample | None:
        src, first, notes = open_first(names, self._factory)
        for n in notes:
            self._note(f"telemetry source {n}")
        self._src = src
        if src is None:
            self.source_name = "none"
            self._note("no telemetry source works here: " + ("; ".join(notes) or "the chain is empty"))
            return None
        self.source_name = src.name
        return first

    def _remaining_after(self, name: str) -> list[str]:
        for i, n in enumerate(self.chain):
            if name == n or name.startswith(n + ":") or (n == "recorded" and name.startswith("recorded:")):
                return self.chain[i + 1:]
        return []

    def _publish(self, s: Sample) -> None:
        self.history.append(s)
        self.reads += 1
        if self.on_sample is not None:
            try:
                self.on_sample(s)
            except Exception as e:  # a consumer's bug must not kill the sampler
                self._note(f"telemetry on_sample callback failed: {type(e).__name__}: {e}")
        with self._new:
            self._new.notify_all()

    def _run(self) -> None:
        self._wall0 = time.monotonic()
        cpu0 = time.thread_time()
        try:
            first = self._open_from(self.chain)
            if first is not None:
                self._publish(first)
            self.open_cpu_s = time.thread_time() - cpu0
            self._open_wall_s = time.monotonic() - self._wall0
            next_t = time.monotonic() + self.interval
            while self._src is not None and not self._stop.is_set():
                self._cpu_s = time.thread_time() - cpu0
                self._wake.wait(max(0.0, next_t - time.monotonic()))
                self._wake.clear()
                if self._stop.is_set():
                    break
                now = time.monotonic()
                if now >= next_t:  # a scheduled tick (not a request_sample): schedule the next one
                    next_t += self.interval
                    if next_t <= now:  # ticks were missed (a slow read): skip them
                        next_t = now + self.interval
                try:
                    s = self._src.read()
                except Exception as e:
                    why = str(e) if isinstance(e, SourceUnavailable) else f"{type(e).__name__}: {e}"
                    failed = self._src.name
                    _close(self._src)
                    rest = self._remaining_after(failed)
                    self._note(f"telemetry source {failed} failed mid-run ({why}); "
                               f"trying {', '.join(rest) or 'nothing else'}")
                    s = self._open_from(rest)
                    if s is None:
                        break
                self._publish(s)
        finally:
            if self._src is not None:
                _close(self._src)
            self._cpu_s = time.thread_time() - cpu0
            self._wall_s = time.monotonic() - self._wall0
            with self._new:
                self._new.notify_all()


def _close(src: Source) -> None:
    try:
        src.close()
    except Exception:
        pass
