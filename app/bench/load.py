"""Busy-looping processes for `kvdeck bench cpu --load N`: a CPU competitor of known size.

`BusyLoad(n, max_s)` is a context manager that starts n child processes, each a pure Python
integer loop (no I/O, no memory traffic to speak of, no syscalls but a clock read every 64 Ki
iterations), and kills them on exit. Every child also ends itself after max_s seconds and, on
Linux, is killed by the kernel when the bench process dies (SIGKILL, a crash), so no spinning
process outlives the bench.
The bench owns the children; nothing else may signal them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

# argv[1]: the child's lifetime in seconds, argv[2]: the parent's pid. On Linux the child also
# asks to be killed when its parent dies (prctl PR_SET_PDEATHSIG = 1, SIGKILL = 9). The clock
# is read once per 65536 additions.
_BUSY_CODE = (
    "import os, sys, time\n"
    "try:\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None).prctl(1, 9)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[2]):\n"
    "    sys.exit(0)\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "x = 0\n"
    "while True:\n"
    "    x += 1\n"
    "    if not x & 0xFFFF and time.monotonic() > end:\n"
    "        break\n"
)
SPIN_UP_CPU_S = 0.05     # a child counts as started once it has used this much CPU time
SPIN_UP_TIMEOUT_S = 5.0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc; psutil where /proc is absent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        import psutil
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system


class BusyLoad:
    """n busy-looping child processes for the duration of a `with` block.

    Enter: starts them and waits until each one is spinning (has used SPIN_UP_CPU_S of CPU).
    `all_alive()`: whether every child is still running (call it after a measurement: a child
    that ended early, e.g. past max_s, means the measurement did not run under the full load).
    Exit: kills every child and reaps it. n = 0 is a no-op.
    """

    def __init__(self, n: int, max_s: float):
        if n < 0:
            raise ValueError(f"load: {n} busy processes (need >= 0)")
        if max_s <= 0:
            raise ValueError(f"load: lifetime {max_s} s (need > 0)")
        self.n, self.max_s = n, max_s
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "BusyLoad":
        try:
            for _ in range(self.n):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-S", "-c", _BUSY_CODE, str(self.max_s), str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + SPIN_UP_TIMEOUT_S
            for p in self.procs:
                while _cpu_seconds(p.pid) < SPIN_UP_CPU_S:
                    if p.poll() is not None:
                        raise RuntimeError(f"load: busy process {p.pid} exited ({p.returncode}) at start")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"load: busy process {p.pid} did not start spinning "
                                           f"within {SPIN_UP_TIMEOUT_S} s")
                    time.sleep(0.01)
        except BaseException:
            self.stop()
            raise
        return self

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def all_alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        """Kill and reap every child (idempotent)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(timeout=10)
        self.procs = []

    def __exit__(self, *exc) -> None:
        self.stop()


# ============================================================================
# Who used the CPU during a measurement
# ============================================================================
def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle since boot (from /proc/stat)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)          # idle + iowait
    guest = sum(vals[8:10]) if len(vals) > 9 else 0             # already counted in user/nice
    return (sum(vals) - idle - guest) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU use during a `with` block, split into this process, the busy children, and others.

    `others_cores` is the noise figure: the average number of cores that processes other than
    the bench and its busy children kept busy (other users of a shared machine). Linux only;
    elsewhere every figure is None.
    """

    def __init__(self, load: BusyLoad | None = None):
        self.load = load
        self.result: dict[str, float | None] = {"wall_s": None, "self_cores": None,
                                                 "busy_children_cores": None, "others_cores": None}

    def _snap(self) -> tuple[float, float, float, float]:
        kids = sum(_cpu_seconds(p) for p in self.load.pids()) if self.load else 0.0
        return time.monotonic(), _machine_busy_s(), _cpu_seconds(os.getpid()), kids

    def __enter__(self) -> "CpuMeter":
        try:
            self.t0 = self._snap()
        except OSError:
            self.t0 = None
        return self

    def __exit__(self, *exc) -> None:
        if self.t0 is None:
            return
        try:
            t1 = self._snap()
        except OSError:
            return
        wall, machine, own, kids = (b - a for a, b in zip(self.t0, t1))
        self.result = {"wall_s": wall, "self_cores": own / wall, "busy_children_cores": kids / wall,
                       "others_cores": max(0.0, machine - own - kids) / wall}
