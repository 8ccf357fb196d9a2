"""`kvdeck telemetry`: live readings, one line a sample.

    kvdeck telemetry [--json] [--count N] [--interval S] [--source NAME] [--trace FILE]
                     [--record FILE] [--sysfs-root DIR] [--cost]

--source forces one source (jtop | jetson-sysfs | nvml | psutil | recorded); without it the
fallback order is tried. --record FILE writes the samples as a trace `--source recorded --trace
FILE` plays back. --cost prints, at the end, the sampler thread's CPU time as % of one core.
Exit status: 0, or 2 when no source works / an argument is bad.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time

from app.telemetry.history import History
from app.telemetry.recorded import TraceWriter
from app.telemetry.sample import Sample
from app.telemetry.sampler import Sampler
from app.telemetry.sources import NAMES, default_chain


def format_line(s: Sample) -> str:
    """One human line: time, source, power (or why not), GPU, CPU, RAM, temperatures, mode, throttle."""
    parts = [time.strftime("%H:%M:%S", time.localtime(s.t_wall)), s.source]
    if s.power_w is not None:
        rails = " ".join(f"{k} {v:.2f}" for k, v in s.rails_w.items() if k != s.power_scope)
        parts.append(f"power {s.power_w:.2f} W ({s.power_scope})" + (f" [{rails}]" if rails else ""))
    else:
        parts.append("board power: unavailable")
    units = sorted(k for k in s.clocks_mhz.keys() | s.load_pct.keys() if k.startswith("gpu"))
    for unit in units + (["cpu"] if "cpu" in s.load_pct or "cpu" in s.clocks_mhz else []):
        load, clk = s.load_pct.get(unit), s.clocks_mhz.get(unit)
        parts.append(" ".join([unit] + ([f"{load:.0f}%"] if load is not None else []) +
                              ([f"@{clk:.0f} MHz"] if clk is not None else [])))
    if "ram_total" in s.mem_mb:
        parts.append(f"ram {s.mem_mb.get('ram_used', 0) / 1024:.1f}/{s.mem_mb['ram_total'] / 1024:.1f} GB")
    if s.temps_c:
        hot = sorted(s.temps_c.items(), key=lambda kv: -kv[1])[:4]
        parts.append("temp " + " ".join(f"{k} {v:.1f}°C" for k, v in hot))
    else:
        parts.append("temp: no sensors")
    if s.power_mode:
        parts.append(f"mode {s.power_mode}")
    active = [k for k, v in s.throttle.items() if v is True]
    counters = {k: v for k, v in s.throttle.items() if not isinstance(v, bool)}
    if s.throttle:
        parts.append("throttle " + (",".join(active) or "none") +
                     ("".join(f" {k}={v}" for k, v in counters.items())))
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvdeck telemetry", description="Live board telemetry (thermals, power, clocks)")
    p.add_argument("--json", action="store_true", help="one JSON line per sample")
    p.add_argument("--count", type=int, default=0, help="stop after N samples (default: run until Ctrl-C)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--source", choices=NAMES, help="force one source instead of the fallback order")
    p.add_argument("--trace", help="a recorded trace (JSON lines) for --source recorded")
    p.add_argument("--record", metavar="FILE", help="also write the samples to FILE as a trace")
    p.add_argument("--sysfs-root", default="/", help="root of the sysfs tree the jetson-sysfs source reads (tests)")
    p.add_argument("--cost", action="store_true", help="at the end, print the sampler's own CPU cost")
    a = p.parse_args(argv)
    if a.count < 0 or not a.interval > 0:
        print("kvdeck telemetry: --count must be >= 0 and --interval > 0", file=sys.stderr)
        return 2
    chain = [a.source] if a.source else default_chain(a.trace)
    q: queue.Queue[Sample] = queue.Queue()
    try:
        writer = TraceWriter(a.record) if a.record else None
    except ValueError as e:
        print(f"kvdeck telemetry: {e}", file=sys.stderr)
        return 2
    sampler = Sampler(interval=a.interval, chain=chain, history=History(raw_len=max(16, a.count + 1)),
                      on_sample=q.put, trace=a.trace, sysfs_root=a.sysfs_root).start()
    shown_notes = 0
    n = 0
    last_sample_notes: tuple = ()
    try:
        while a.count == 0 or n < a.count:
            try:
                s = q.get(timeout=0.2)
            except queue.Empty:
                shown_notes = _flush_notes(sampler, shown_notes)
                if not sampler.running:
                    break
                continue
            shown_notes = _flush_notes(sampler, shown_notes)
            if s.notes != last_sample_notes and not a.json:  # the source's own notes, when they change
                for line in s.notes:
                    print(f"# {s.source}: {line}", file=sys.stderr, flush=True)
                last_sample_notes = s.notes
            if n == 0 and not a.json:
                print(f"# source: {sampler.source_name}" +
                      ("" if s.power_w is not None else " (board power unavailable: no power sensor this source can read)"))
            print(json.dumps(s.as_dict(), separators=(",", ":")) if a.json else format_line(s), flush=True)
            if writer:
                writer.write(s)
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
        if writer:
            writer.close()
    _flush_notes(sampler, shown_notes)
    if a.cost:
        steady = sampler.cpu_s - sampler.open_cpu_s
        reads = max(1, sampler.reads - 1)
        print(f"# sampler cost: {sampler.cost_pct():.3f}% of one core at {1 / a.interval:g} Hz "
              f"({steady * 1000:.1f} ms CPU for {sampler.reads - 1} reads after the first, "
              f"{steady * 1000 / reads:.2f} ms per read; opening {sampler.source_name}: "
              f"{sampler.open_cpu_s * 1000:.1f} ms once)", file=sys.stderr)
    if n == 0:
        print("kvdeck telemetry: no source produced a sample", file=sys.stderr)
        return 2
    return 0


def _flush_notes(sampler: Sampler, shown: int) -> int:
    """Print the notes added since `shown` (a count of notes ever added); return the new count."""
    total, notes = sampler.notes_total, list(sampler.notes)
    for line in notes[max(0, len(notes) - (total - shown)):]:
        print(f"# {line}", file=sys.stderr, flush=True)
    return total
