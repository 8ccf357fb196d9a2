"""A/B of two CPU kernel sets on the same weights, interleaved (issue 13, the AVX-512 set).

  python native/kernels/cpu/bench/isa_ab.py [--isas avx2,avx512vnni] [--rounds 3] [--formats ...]
      [--gemv-shapes q,gate/up,down,lm_head] [--gemm-m 64,512] [--threads 1,2]

Each cell: the same weight arrays and activations under each ISA in turn (set_kernel_isa), the
order alternating per round; best per ISA over the rounds (app/bench/kernels.py _time: best of 3
of >= 0.15 s). nvfp4 is timed in the layout the ISA's set repacks to at load (kernels
`preferred_layout`, as the engine runs it), so an ISA that repacks and one that does not are
compared as the engine sees them. Prints GB/s (GEMV, weight bytes) and GFLOP/s (GEMM, 2MNK), and
the ratio second/first ISA. `--clock cpu`: one-thread cells timed in this thread's CPU time
(time.thread_time: the kernel runs on the calling thread), so time the scheduler gave other
processes is not counted; on a machine with more runnable processes than cores that removes
most of the noise (cache interference stays).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from app.bench import kernels as kb  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isas", default="avx2,avx512vnni")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--formats", default="f32,f16,nvfp4,w4a8,q4_1,w8a8")
    ap.add_argument("--gemv-shapes", default="q,gate/up,down,lm_head")
    ap.add_argument("--gemm-m", default="64,512")
    ap.add_argument("--gemm-shapes", default="q,gate/up,down")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--json", help="write the raw cells here")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    a = ap.parse_args()
    k = kb._kernels()
    isas = a.isas.split(",")
    rng = np.random.default_rng(0)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"isa_ab: {' vs '.join(isas)}; clock {a.clock}; load {' '.join(load)}; {time.strftime('%H:%M:%S')}")
    cells = []

    def layout_fmt(fmt, isa):
        if fmt != "nvfp4":
            return fmt
        k.set_kernel_isa(isa)
        return "nvfp4_x4" if k.preferred_layout("nvfp4") == "nvfp4_x4" else "nvfp4"

    def w8a8_weights(N, K):
        """int8 codes [N, Kp] and f16 scales per 32-block (the 8-bit head; not in app/bench/kernels.py)."""
        r = np.random.default_rng(1)
        Kp = -(-K // 32) * 32
        w = dict(data=r.integers(-128, 128, (N, Kp), dtype=np.int8),
                 scales=(r.random((N, Kp // 32), dtype=np.float32) * 0.01 + 0.001).astype(np.float16))
        return w, sum(v.nbytes for v in w.values())

    def cpu_time(f, w, x):
        """Seconds of this thread's CPU per call, best of 3 (as kb._time, in thread_time)."""
        def timed(reps):
            t0 = time.thread_time()
            kb._call(k, f, w, x, repeat=reps)
            return time.thread_time() - t0
        timed(1)
        one = max(timed(1), 1e-6)
        reps = max(1, min(100_000, int(kb.MIN_TIME_S / one)))
        return min(timed(reps) / reps for _ in range(3))

    def measure(kind, fmt, N, K, M, threads):
        ws = {}
        for isa in isas:
            f = layout_fmt(fmt, isa)
            if f not in ws:
                ws[f] = w8a8_weights(N, K) if f == "w8a8" else kb._random_weights(k, f, N, K, np.random.default_rng(1))
        x = rng.standard_normal((M, K), dtype=np.float32)
        best = {isa: float("inf") for isa in isas}
        for r in range(a.rounds):
            for isa in (isas if r % 2 == 0 else isas[::-1]):
                f = layout_fmt(fmt, isa)
                k.set_kernel_isa(isa)
                w, nbytes = ws[f]
                best[isa] = min(best[isa], cpu_time(f, w, x) if a.clock == "cpu" and threads == 1
                                else kb._time(k, f, w, x, threads))
        nbytes = ws[layout_fmt(fmt, isas[0])][1]
        unit = (lambda s: nbytes / s / 1e9) if kind == "gemv" else (lambda s: 2 * M * N * K / s / 1e9)
        vals = [unit(best[i]) for i in isas]
        lay = "/".join(layout_fmt(fmt, i) for i in isas)
        u = "GB/s" if kind == "gemv" else "GFLOP/s"
        print(f"  {kind} {fmt:6} {lay:18} M={M:<4} {threads}T {N:>6}x{K:<5} "
              + "  ".join(f"{i} {v:7.1f}" for i, v in zip(isas, vals)) + f" {u}  ratio {vals[1] / vals[0]:.3f}",
              flush=True)
        cells.append(dict(kind=kind, format=fmt, layouts=lay, M=M, threads=threads, N=N, K=K,
                          **{i: v for i, v in zip(isas, vals)}, unit=u))

    fmts = a.formats.split(",")
    for threads in [int(t) for t in a.threads.split(",")]:
        for name in a.gemv_shapes.split(","):
            if not name:
                continue
            N, K = kb.SHAPES[name]
            for fmt in fmts:
                measure("gemv", fmt, N, K, 1, threads)
    for M in [int(m) for m in a.gemm_m.split(",") if m]:
        for name in a.gemm_shapes.split(","):
            N, K = kb.SHAPES[name]
            for fmt in fmts:
                measure("gemm", fmt, N, K, M, 1)
    load2 = Path("/proc/loadavg").read_text().split()[:3]
    print(f"isa_ab: done {time.strftime('%H:%M:%S')}; load {' '.join(load2)}")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(isas=isas, load_before=load, load_after=load2, cells=cells), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
