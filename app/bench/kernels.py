"""`kvdeck bench kernels [--json] [--quick] [--threads 1,2]`: the CPU kernels of kvdeck/kernels.h.

For every weight format and every ISA the CPU supports:
  * GEMV (M = 1, decode) on the SmolLM2-135M shapes: GB/s of weight bytes read and the ratio
    to a same-run memory copy bandwidth (numpy, 256 MiB buffer, read + write bytes counted).
    "hot": the same matrix again and again (weights in cache for the small ones);
    "stream": one call over a weight stack of STREAM_BYTES (far beyond the L3), the regime
    of a real decode step. With 2 threads the rows are split in two halves run at once
    (as the engine splits them), GB/s counts both.
  * GEMM (M = 64, 512, prefill; one thread): GFLOP/s (2*M*N*K per call).
Formats: f32, f16, nvfp4 (the file layout), nvfp4_x4 (nvfp4 repacked as the CPU backend does at
load, kernels.h WeightLayout::Nvfp4X4), w4a8 (group 32), q4_1 (w4a8 + per-32 minimums: the
gguf folder's GGUF Q4_1 blocks); w4a8_a16 and q4_1_a16 the same weights on 16-bit
activations (the gguf folder's default, gemm_a16*.cpp). Same weight bytes for nvfp4, nvfp4_x4 and w4a8 (4.5 bits per
weight); q4_1 adds 0.5. Each ISA x format is validated against a float64 numpy oracle first.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

# SmolLM2-135M: hidden 576, intermediate 1536, 9 q heads / 3 kv heads of 64, vocab 49152.
SHAPES = {  # name: (N, K)
    "q": (576, 576),
    "k/v": (192, 576),
    "gate/up": (1536, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}
GEMM_M = (64, 512)
FORMATS = ("f32", "f16", "nvfp4", "nvfp4_x4", "w4a8", "q4_1", "w4a8_a16", "q4_1_a16")
ISAS = ("scalar", "avx2", "avx512vnni")
COPY_BYTES = 256 << 20      # memcpy reference buffer
STREAM_BYTES = 128 << 20    # weight stack for the streaming GEMV (4x a 32 MiB L3)
MIN_TIME_S = 0.15           # time each measurement for at least this long
VALIDATE_TOL = 1e-5         # |y - ref| / sum|x w| (see tests/native/test_kernels.py)
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
             "asimd", "asimddp")


def _kernels():
    from app.engine import _native
    return _native.kernels


def cpu_flags() -> list[str]:
    """The SIMD flags of /proc/cpuinfo that the kernels care about (empty off Linux)."""
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return []
    for line in path.read_text().splitlines():
        if line.startswith(("flags", "Features")):
            have = set(line.split(":", 1)[1].split())
            return [f for f in CPU_FLAGS if f in have]
    return []


def copy_bandwidth() -> float:
    """Bytes/s of a numpy copy (read + write counted), best of 5, 256 MiB."""
    src = np.ones(COPY_BYTES // 8, np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * COPY_BYTES / best


# ============================================================================
# Weights and calls
# ============================================================================

def _random_weights(k, fmt: str, N: int, K: int, rng) -> tuple[dict, int]:
    """Valid random weight arrays (no quantiser run: fast for big stacks) and their bytes."""
    Kp = -(-K // 32) * 32
    if fmt == "f32":
        w = dict(data=rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.05))
    elif fmt == "f16":
        w = dict(data=(rng.standard_normal((N, K), dtype=np.float32) * 0.05).astype(np.float16))
    elif fmt in ("nvfp4", "nvfp4_x4"):
        w = dict(data=rng.integers(0, 256, (N, Kp // 2), dtype=np.uint8),
                 scales=rng.integers(0x30, 0x48, (N, Kp // 16), dtype=np.uint8), tscale=1e-3)
        if fmt == "nvfp4_x4":
            w["data"], w["scales"] = k.repack_nvfp4_x4(w["data"], w["scales"])
            w["layout"] = "nvfp4_x4"
    else:
        w = dict(data=rng.integers(0, 256, (N, Kp // 2), dtype=np.uint8),
                 scales=(rng.random((N, Kp // 32), dtype=np.float32) * 0.01).astype(np.float16))
        if fmt.startswith("q4_1"):
            w["mins"] = (rng.random((N, Kp // 32), dtype=np.float32) * -0.05).astype(np.float16)
    nbytes = sum(v.nbytes for v in w.values() if isinstance(v, np.ndarray))
    return w, nbytes


def _dtype(fmt: str) -> str:
    return {"nvfp4_x4": "nvfp4", "q4_1": "w4a8", "w4a8_a16": "w4a8", "q4_1_a16": "w4a8"}.get(fmt, fmt)


def _call(k, fmt, w, x, repeat=1, n0=0, n1=None):
    kw = {key: v for key, v in w.items() if key != "data"}
    bits = 16 if fmt.endswith("_a16") else 8
    return k.gemm(_dtype(fmt), w["data"], x, repeat=repeat, n0=n0, n1=n1, act_bits=bits, **kw)


def _timed(k, fmt, w, x, reps: int, threads: int) -> float:
    """Seconds for `reps` calls: one thread, or `threads` threads on disjoint row ranges at once
    (rows split on multiples of 16, as the engine's tasks are)."""
    if threads == 1:
        t0 = time.perf_counter()
        _call(k, fmt, w, x, repeat=reps)
        return time.perf_counter() - t0
    N = w["data"].shape[0]
    cut = [min(N, -(-N * i // threads // 16) * 16) for i in range(threads + 1)]
    start = threading.Barrier(threads + 1)

    def work(i):
        start.wait()
        _call(k, fmt, w, x, repeat=reps, n0=cut[i], n1=cut[i + 1])

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def _time(k, fmt, w, x, threads=1) -> float:
    """Seconds per kernel call, best of 3 (repeat inside one native call; the activation
    quantisation and the Python call are amortised over the repeats)."""
    one = max(_timed(k, fmt, w, x, 1, threads), 1e-7)
    one = max(_timed(k, fmt, w, x, 1, threads), 1e-7)
    reps = max(1, min(100_000, int(MIN_TIME_S / one)))
    return min(_timed(k, fmt, w, x, reps, threads) / reps for _ in range(3))


def validate(k, fmt: str, rng) -> float:
    """Max relative error (vs the L1 norm of the products) of the kernel against the float64
    oracle built from models/quant, on an awkward shape; raises on failure."""
    from models.quant.e2m1 import decode_e2m1
    from models.quant.e4m3 import decode_e4m3
    from models.quant.nvfp4 import quantize_nvfp4, unpack_nibbles
    from models.quant.q8 import quantize_act_q8
    from models.quant.w4a8 import quantize_w4a8

    N, K, M = 37, 200, 5
    w = rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.05)
    x = rng.standard_normal((M, K), dtype=np.float32)
    xd = x.astype(np.float64)
    if fmt == "f32":
        kw, wd = dict(data=w), w.astype(np.float64)
    elif fmt == "f16":
        kw = dict(data=w.astype(np.float16))
        wd = kw["data"].astype(np.float64)
    elif fmt in ("nvfp4", "nvfp4_x4"):
        t = quantize_nvfp4(w)
        kw = dict(data=t.codes, scales=t.scales, tscale=float(t.tscale))
        wd = (decode_e2m1(unpack_nibbles(t.codes)).astype(np.float64)
              * np.repeat(decode_e4m3(t.scales).astype(np.float64), 16, axis=1) * float(t.tscale))[:, :K]
        if fmt == "nvfp4_x4":
            kw["data"], kw["scales"] = k.repack_nvfp4_x4(t.codes, t.scales)
            kw["layout"] = "nvfp4_x4"
    else:
        t = quantize_w4a8(w, group=32)
        kw = dict(data=t.codes, scales=t.scales)
        wd = ((unpack_nibbles(t.codes).astype(np.float64) - 8)
              * np.repeat(t.scales.astype(np.float64), t.group, axis=1))[:, :K]
        if fmt.startswith("q4_1"):  # w = q * scale + (min + 8 * scale), min of the block
            kw["mins"] = (rng.standard_normal((N, t.scales.shape[1])) * 0.01).astype(np.float16)
            wd = wd + np.repeat(kw["mins"].astype(np.float64) + 8 * t.scales.astype(np.float64), 32, axis=1)[:, :K]
    if fmt.endswith("_a16"):  # the 16-bit quantiser (checked against numpy in tests/native/test_a16.py)
        q, d, _ = k.quantize_act_q8(x, bits=16)
        xd = (q.reshape(M, -1, 32) * d[:, :, None].astype(np.float64)).reshape(M, -1)[:, :K]
    elif fmt not in ("f32", "f16"):
        q, d, _ = quantize_act_q8(x)
        xd = (q.reshape(M, -1, 32) * d[:, :, None].astype(np.float64)).reshape(M, -1)[:, :K]
    y = _call(k, fmt, kw, x)
    err = float((np.abs(y - xd @ wd.T) / (np.abs(xd) @ np.abs(wd).T + 1e-30)).max())
    if not err <= VALIDATE_TOL:
        raise AssertionError(f"{fmt}: max rel err {err:.3g} > {VALIDATE_TOL}")
    return err


# ============================================================================
# Tables
# ============================================================================

def _gemv_tables(k, isa, args, rng, copy_bps, out, say):
    slow = isa == "scalar"   # the reference path: fewer shapes, to keep it short
    shapes = ["q", "down"] if (slow or args.quick) else list(SHAPES)
    for threads in args.threads:
        say(f"  GEMV M=1 {threads}T {'shape':>14} " + " ".join(f"{f:>17}" for f in FORMATS))
        for name in shapes + ["stream"]:
            cells = []
            for fmt in FORMATS:
                if name == "stream":
                    N0, K = SHAPES["gate/up"]
                    _, row_bytes = _random_weights(k, fmt, 16, K, rng)
                    N = max(N0, STREAM_BYTES * 16 // row_bytes // 16 * 16) if not slow else N0 * 4
                else:
                    N, K = SHAPES[name]
                w, nbytes = _random_weights(k, fmt, N, K, rng)
                x = rng.standard_normal((1, K), dtype=np.float32)
                s = _time(k, fmt, w, x, threads)
                gbps = nbytes / s / 1e9
                out["gemv"].append({"isa": isa, "format": fmt, "threads": threads, "shape": name, "N": N,
                                    "K": K, "weight_bytes": nbytes, "s": s, "GBps": gbps,
                                    "pct_copy": 100 * gbps * 1e9 / copy_bps})
                cells.append(f"{gbps:6.1f} GB/s {100 * gbps * 1e9 / copy_bps:4.0f}%")
            label = f"{name} {N}x{K}" if name != "stream" else f"stream {N >> 10}k rows"
            say(f"  {'':13} {label:>14} " + " ".join(f"{c:>17}" for c in cells))


def _gemm_tables(k, isa, rng, out, say):
    slow = isa == "scalar"
    shapes = ["q"] if slow else ["q", "k/v", "gate/up", "down", "lm_head"]
    for M in GEMM_M if not slow else (64,):
        say(f"  GEMM M={M:<4} 1T {'shape':>11} " + " ".join(f"{f:>17}" for f in FORMATS))
        for name in shapes:
            N, K = SHAPES[name]
            if name == "lm_head" and M > 64:
                continue  # 29 GFLOP per call: skipped to keep the run short
            cells = []
            for fmt in FORMATS:
                w, _ = _random_weights(k, fmt, N, K, rng)
                x = rng.standard_normal((M, K), dtype=np.float32)
                s = _time(k, fmt, w, x)
                gf = 2 * M * N * K / s / 1e9
                out["gemm"].append({"isa": isa, "format": fmt, "threads": 1, "shape": name, "M": M,
                                    "N": N, "K": K, "s": s, "GFLOPs": gf})
                cells.append(f"{gf:8.1f} GFLOP/s")
            say(f"  {'':13} {name + f' {N}x{K}':>14} " + " ".join(f"{c:>17}" for c in cells))


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvdeck bench kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    ap.add_argument("--quick", action="store_true", help="GEMV only, fewer shapes")
    ap.add_argument("--threads", default="1,2", help="GEMV thread counts, comma-separated (default 1,2)")
    ap.add_argument("--isa", help="only this ISA (default: every one the CPU supports)")
    args = ap.parse_args(argv)
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
        assert args.threads and all(t >= 1 for t in args.threads)
    except (ValueError, AssertionError):
        ap.error(f"--threads: comma-separated counts >= 1, got {args.threads!r}")
    k = _kernels()
    rng = np.random.default_rng(0)
    isas = [i for i in ISAS if k.cpu_supports(i) and (args.isa is None or i == args.isa)]
    if not isas:
        ap.error(f"--isa {args.isa}: not supported here (supported: "
                 f"{', '.join(i for i in ISAS if k.cpu_supports(i))})")
    default_isa = k.kernel_isa()
    copy_bps = copy_bandwidth()
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").is_file() else "?"
    out = {"copy_GBps": copy_bps / 1e9, "threads": args.threads, "isas": isas, "default_isa": default_isa,
           "cpu_flags": cpu_flags(), "load_1min_before": load, "gemv": [], "gemm": [], "validation": []}
    say = (lambda *a: None) if args.json else print
    say(f"kvdeck bench kernels — memcpy (numpy, 256 MiB, read+write) {copy_bps / 1e9:.1f} GB/s; "
        f"ISAs {', '.join(isas)} (default {default_isa}); CPU flags {' '.join(out['cpu_flags']) or '?'}; "
        f"1-min load {load}")
    try:
        for isa in isas:
            k.set_kernel_isa(isa)
            for fmt in FORMATS:
                err = validate(k, fmt, rng)
                out["validation"].append({"isa": isa, "format": fmt, "max_rel_err": err})
            say(f"\n[{isa}] validated all formats against the float64 oracle "
                f"(max rel err {max(v['max_rel_err'] for v in out['validation'] if v['isa'] == isa):.1e})")
            _gemv_tables(k, isa, args, rng, copy_bps, out, say)
            if not args.quick:
                _gemm_tables(k, isa, rng, out, say)
    except AssertionError as e:
        print(f"validation failed: {e}", file=sys.stderr)
        return 1
    finally:
        k.set_kernel_isa(default_isa)
    if Path("/proc/loadavg").is_file():
        out["load_1min_after"] = Path("/proc/loadavg").read_text().split()[0]
        say(f"\n1-min load after: {out['load_1min_after']}")
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
