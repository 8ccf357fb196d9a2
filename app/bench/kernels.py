"""`kvdeck bench kernels [--json] [--quick]`: the CPU kernels of kvdeck/kernels.h.

For every weight format (f32, f16, nvfp4, w4a8) and every ISA the CPU supports:
  * GEMV (M = 1, decode) on the SmolLM2-135M shapes: GB/s of weight bytes read and the ratio
    to a same-run memory copy bandwidth (numpy, 256 MiB buffer, read + write bytes counted).
    "hot": the same matrix again and again (cache-resident for the small ones);
    "stream": one call over a weight stack of kStreamBytes (far beyond the L3), the regime
    of a real decode step.
  * GEMM (M = 64, 512, prefill): GFLOP/s (2*M*N*K per call).
Every kernel call is single-threaded (the engine splits rows across threads itself).
Each ISA x format is validated against a float64 numpy oracle before it is timed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

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
FORMATS = ("f32", "f16", "nvfp4", "w4a8")
ISAS = ("scalar", "avx2", "avx512vnni")
COPY_BYTES = 256 << 20      # memcpy reference buffer
STREAM_BYTES = 128 << 20    # weight stack for the streaming GEMV (4x a 32 MiB L3)
MIN_TIME_S = 0.15           # time each measurement for at least this long
VALIDATE_TOL = 1e-5         # |y - ref| / sum|x w| (see tests/native/test_kernels.py)


def _kernels():
    from app.engine import _native
    return _native.kernels


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


def _random_weights(fmt: str, N: int, K: int, rng) -> tuple[dict, int]:
    """Valid random weight arrays (no quantiser run: fast for big stacks) and their bytes."""
    Kp = -(-K // 32) * 32
    if fmt == "f32":
        w = dict(data=rng.standard_normal((N, K), dtype=np.float32) * np.float32(0.05))
    elif fmt == "f16":
        w = dict(data=(rng.standard_normal((N, K), dtype=np.float32) * 0.05).astype(np.float16))
    elif fmt == "nvfp4":
        w = dict(data=rng.integers(0, 256, (N, Kp // 2), dtype=np.uint8),
                 scales=rng.integers(0x30, 0x48, (N, Kp // 16), dtype=np.uint8), tscale=1e-3)
    else:
        w = dict(data=rng.integers(0, 256, (N, Kp // 2), dtype=np.uint8),
                 scales=(rng.random((N, Kp // 32), dtype=np.float32) * 0.01).astype(np.float16))
    nbytes = sum(v.nbytes for v in w.values() if isinstance(v, np.ndarray))
    return w, nbytes


def _call(k, fmt, w, x, repeat=1):
    kw = {key: v for key, v in w.items() if key != "data"}
    return k.gemm(fmt, w["data"], x, repeat=repeat, **kw)


def _time(k, fmt, w, x) -> float:
    """Seconds per kernel call (repeat inside one native call; the activation quantisation
    and the Python call are amortised over the repeats)."""
    _call(k, fmt, w, x)
    t0 = time.perf_counter()
    _call(k, fmt, w, x)
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, min(100_000, int(MIN_TIME_S / one)))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        _call(k, fmt, w, x, repeat=reps)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


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
    elif fmt == "nvfp4":
        t = quantize_nvfp4(w)
        kw = dict(data=t.codes, scales=t.scales, tscale=float(t.tscale))
        wd = (decode_e2m1(unpack_nibbles(t.codes)).astype(np.float64)
              * np.repeat(decode_e4m3(t.scales).astype(np.float64), 16, axis=1) * float(t.tscale))[:, :K]
    else:
        t = quantize_w4a8(w, group=32)
        kw = dict(data=t.codes, scales=t.scales)
        wd = ((unpack_nibbles(t.codes).astype(np.float64) - 8)
              * np.repeat(t.scales.astype(np.float64), t.group, axis=1))[:, :K]
    if fmt in ("nvfp4", "w4a8"):
        q, d, _ = quantize_act_q8(x)
        xd = (q.reshape(M, -1, 32) * d[:, :, None].astype(np.float64)).reshape(M, -1)[:, :K]
    y = _call(k, fmt, kw, x)
    err = float((np.abs(y - xd @ wd.T) / (np.abs(xd) @ np.abs(wd).T + 1e-30)).max())
    if not err <= VALIDATE_TOL:
        raise AssertionError(f"{fmt}: max rel err {err:.3g} > {VALIDATE_TOL}")
    return err


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvdeck bench kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    ap.add_argument("--quick", action="store_true", help="GEMV only, fewer shapes")
    args = ap.parse_args(argv)
    k = _kernels()
    rng = np.random.default_rng(0)
    isas = [i for i in ISAS if k.cpu_supports(i)]
    default_isa = k.kernel_isa()
    copy_bps = copy_bandwidth()
    out = {"copy_GBps": copy_bps / 1e9, "threads": 1, "isas": isas, "default_isa": default_isa,
           "gemv": [], "gemm": [], "validation": []}
    say = (lambda *a: None) if args.json else print
    say(f"kvdeck bench kernels — single-threaded kernel calls; memcpy (numpy, 256 MiB, read+write) "
        f"{copy_bps / 1e9:.1f} GB/s; ISAs {', '.join(isas)} (default {default_isa})")
    try:
        for isa in isas:
            k.set_kernel_isa(isa)
            slow = isa == "scalar"   # the reference path: one shape per table, to keep it short
            for fmt in FORMATS:
                err = validate(k, fmt, rng)
                out["validation"].append({"isa": isa, "format": fmt, "max_rel_err": err})
            say(f"\n[{isa}] validated all formats against the float64 oracle "
                f"(max rel err {max(v['max_rel_err'] for v in out['validation'] if v['isa'] == isa):.1e})")
            say(f"  GEMV M=1   {'shape':>14} " + " ".join(f"{f:>17}" for f in FORMATS))
            gemv_shapes = ["q", "down"] if (slow or args.quick) else list(SHAPES)
            for name in gemv_shapes + ["stream"]:
                cells = []
                for fmt in FORMATS:
                    if name == "stream":
                        N0, K = SHAPES["gate/up"]
                        _, row_bytes = _random_weights(fmt, 1, K, rng)
                        N = max(N0, STREAM_BYTES // row_bytes) if not slow else N0 * 4
                    else:
                        N, K = SHAPES[name]
                    w, nbytes = _random_weights(fmt, N, K, rng)
                    x = rng.standard_normal((1, K), dtype=np.float32)
                    s = _time(k, fmt, w, x)
                    gbps = nbytes / s / 1e9
                    out["gemv"].append({"isa": isa, "format": fmt, "shape": name, "N": N, "K": K,
                                        "weight_bytes": nbytes, "s": s, "GBps": gbps,
                                        "pct_copy": 100 * gbps * 1e9 / copy_bps})
                    cells.append(f"{gbps:6.1f} GB/s {100 * gbps * 1e9 / copy_bps:4.0f}%")
                label = f"{name} {N}x{K}" if name != "stream" else f"stream {N >> 10}k rows"
                say(f"  {'':10} {label:>14} " + " ".join(f"{c:>17}" for c in cells))
            if args.quick:
                continue
            gemm_shapes = ["q"] if slow else ["q", "k/v", "gate/up", "down", "lm_head"]
            for M in GEMM_M if not slow else (64,):
                say(f"  GEMM M={M:<4}{'shape':>14} " + " ".join(f"{f:>17}" for f in FORMATS))
                for name in gemm_shapes:
                    N, K = SHAPES[name]
                    if name == "lm_head" and M > 64:
                        continue  # 29 GFLOP per call: skipped to keep the run short
                    cells = []
                    for fmt in FORMATS:
                        w, _ = _random_weights(fmt, N, K, rng)
                        x = rng.standard_normal((M, K), dtype=np.float32)
                        s = _time(k, fmt, w, x)
                        gf = 2 * M * N * K / s / 1e9
                        out["gemm"].append({"isa": isa, "format": fmt, "shape": name, "M": M,
                                            "N": N, "K": K, "s": s, "GFLOPs": gf})
                        cells.append(f"{gf:8.1f} GFLOP/s")
                    say(f"  {'':10} {name + f' {N}x{K}':>14} " + " ".join(f"{c:>17}" for c in cells))
    except AssertionError as e:
        print(f"validation failed: {e}", file=sys.stderr)
        return 1
    finally:
        k.set_kernel_isa(default_isa)
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
