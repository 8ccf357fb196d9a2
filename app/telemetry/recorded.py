"""Recorded traces: JSON lines, one `Sample.as_dict()` per line (what `kvdeck telemetry --record` writes).

`load_trace(path)` parses a whole trace (errors name the file and line). `RecordedSource` plays one
back as a live source: each read() returns the next sample, its t_mono moved onto the current
monotonic clock (spacing between samples preserved relative to the first read) and its source
renamed "recorded:<original source>", so nothing recorded passes for a live reading.
`TraceWriter` appends samples to a file (it owns the file handle; close() it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from app.telemetry.sample import Sample, SourceUnavailable


def load_trace(path: str | Path) -> list[Sample]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{p}: cannot read the trace ({e.strerror or e})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{n}: not JSON ({e.msg})") from None
        out.append(Sample.from_dict(d, where=f"{p}:{n}"))
    if not out:
        raise ValueError(f"{p}: the trace has no samples")
    for a, b in zip(out, out[1:]):
        if b.t_mono < a.t_mono:
            raise ValueError(f"{p}: samples out of time order (t_mono {b.t_mono} after {a.t_mono})")
    return out


class RecordedSource:
    """Source "recorded": plays a trace; raises SourceUnavailable when it ends (unless loop)."""

    def __init__(self, path: str | Path, loop: bool = False):
        self.path = Path(path)
        self.loop = loop
        self.name = f"recorded:{self.path.name}"
        self._samples: list[Sample] = []
        self._i = 0
        self._offset: float | None = None

    def open(self) -> None:
        try:
            self._samples = load_trace(self.path)
        except ValueError as e:
            raise SourceUnavailable(str(e)) from None
        self._i, self._offset = 0, None

    def read(self) -> Sample:
        if not self._samples:
            raise SourceUnavailable("recorded source read before open()")
        if self._i >= len(self._samples):
            if not self.loop:
                raise SourceUnavailable(f"trace {self.path} ended after {len(self._samples)} samples")
            self._i, self._offset = 0, None
        s = self._samples[self._i]
        self._i += 1
        if self._offset is None:
            self._offset = time.monotonic() - s.t_mono
        return s.shifted(self._offset, source=f"recorded:{s.source}")

    def close(self) -> None:
        self._samples = []


class TraceWriter:
    """Appends samples as JSON lines to `path` (created or truncated on open)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._f = open(self.path, "w", encoding="utf-8")
        except OSError as e:
            raise ValueError(f"{self.path}: cannot write the trace ({e.strerror or e})") from None
        self.count = 0

    def write(self, s: Sample) -> None:
        self._f.write(json.dumps(s.as_dict(), separators=(",", ":")) + "\n")
        self._f.flush()
        self.count += 1

    def close(self) -> None:
        self._f.close()
