"""`kvdeck bench attention [--json] [--quick]`: CPU attention against the memory roofline.

Decode (one query after ctx tokens) over f16 and nvfp4 KV pages, through the CPU backend's
attention op (the engine's own call, BackendOps.attention_timing), on 1 and 2 threads:
  * "layer": µs per step of one layer (its K/V stay in cache between repetitions);
  * "model": µs per step of every layer (each layer's own K/V: streamed from DRAM as in a
    real decode step), the KV bytes that step reads per second, and that over the same run's
    copy bandwidth on the same number of threads (numpy, 256 MiB split over the threads, read +
    write counted): the roofline fraction.
Prefill: a tail of new tokens over a cached prefix (the seed-000 shape: 500 over 4,000),
attention alone, every layer. Shapes: SmolLM2-135M (9 q heads, 3 KV heads, D 64, 30 layers)
and a Llama-8B-like 32 / 8 / 128 with 32 layers. Each KV format is validated against a
float64 softmax before it is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

SHAPES = {  # name: (q heads, KV heads, D, layers)
    "smollm2-135m": (9, 3, 64, 30),
    "llama-8b-like": (32, 8, 128, 32),
}
CONTEXTS = (2048, 8192)
KV_FORMATS = ("f16", "nvfp4")
THREADS = (1, 2)
PREFILL = (4000, 500)  # cached tokens, new tokens
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "asimd", "asimddp")  # /proc/cpuinfo names


def kv_row_bytes(kv: str, D: int) -> int:
    return {"f32": 4 * D, "f16": 2 * D, "nvfp4": D // 2 + D // 16}[kv]


def step_bytes(kv: str, ctx: int, nkv: int, D: int, layers: int) -> int:
    """KV bytes one decode step reads: every token's K and V row of every KV head and layer."""
    return 2 * ctx * nkv * kv_row_bytes(kv, D) * layers


def validate(kv: str) -> float:
    """Max error of the backend's decode and prefill attention against float64 (relative to
    max |v|) on the values the pool stores; raises when above 1e-4. Where decode scores nvfp4
    pages with int8 q (kernels.attention_scores_int8), its reference takes q as rounded there
    (int8 per 16 values, d = amax/127)."""
    from app.engine import _native

    rng = np.random.default_rng(1)
    nh, nkv, D, p0, M = 9, 3, 64, 530, 7
    k = rng.standard_normal((p0 + M, nkv, D)).astype(np.float32)
    v = rng.standard_normal((p0 + M, nkv, D)).astype(np.float32)
    q = rng.standard_normal((M, nh * D)).astype(np.float32)
    if kv == "nvfp4":
        store = lambda x: _native.kv_nvfp4_roundtrip(x.reshape(-1, D))[1].reshape(x.shape)  # noqa: E731
    else:
        store = lambda x: x.astype(np.float16).astype(np.float32)  # noqa: E731
    kd, vd = store(k).astype(np.float64), store(v).astype(np.float64)
    ops = _native.BackendOps("cpu", 2)
    worst = 0.0
    for p, m in ((p0 + M - 1, 1), (p0, M)):  # one decode step, one prefill tile
        out = ops.attention(q[-m:], k[:p + m], v[:p + m], p, kv)
        qr = q[-m:].astype(np.float64)
        if m == 1 and _native.kernels.attention_scores_int8(kv, D):
            x = q[-m:].reshape(m, -1, 16)
            amax = np.abs(x).max(axis=2, keepdims=True)
            qr = (np.rint(x * (np.float32(127) / amax)) * (amax / np.float32(127)).astype(np.float64)).reshape(m, -1)
        for i in range(m):
            c = p + i + 1
            for h in range(nh):
                g = h // (nh // nkv)
                s = kd[:c, g] @ qr[i, h * D:(h + 1) * D] / np.sqrt(D)
                w = np.exp(s - s.max())
                ref = (w / w.sum()) @ vd[:c, g]
                worst = max(worst, float(np.abs(out[i, h * D:(h + 1) * D] - ref).max() / np.abs(v).max()))
    # decode's integer P·V over nvfp4 (KVDECK_ATTN_INT_V): its weights' 8-bit rounding, not modelled here
    bound = 1e-2 if kv == "nvfp4" and _native.kernels.attention_scores_int8(kv, D) and os.environ.get(
        "KVDECK_ATTN_INT_V", "1") != "0" else 1e-4
    if worst > bound:
        raise RuntimeError(f"{kv} attention differs from float64 by {worst:.2e} of max|v| (bound {bound:.0e})")
    return worst


def copy_bandwidth(threads: int, nbytes: int = 256 << 20, reps: int = 5) -> float:
    """Bytes/s of a copy of nbytes (read + write counted) split over `threads` threads (numpy
    copies release the GIL), best of reps: the roofline for attention run on that many threads."""
    import threading
    import time

    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    n = src.size
    parts = [slice(i * n // threads, (i + 1) * n // threads) for i in range(threads)]
    best = float("inf")
    for _ in range(reps + 1):  # the first pass faults the pages in
        go = threading.Barrier(threads + 1)
        done = []

        def work(sl):
            go.wait()
            np.copyto(dst[sl], src[sl])
            done.append(time.perf_counter())

        ts = [threading.Thread(target=work, args=(sl,)) for sl in parts]
        for t in ts:
            t.start()
        go.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        best = min(best, max(done) - t0)
    return 2 * nbytes / best


def decode_fidelity(kv: str = "nvfp4", ref: str = "f16", weights: str = "nvfp4", prefix: int = 586,
                    model: str = "smollm2-135m") -> dict:
    """Top-1 agreement of real decode steps over kv pages against ref pages: the eval texts
    (app/bench/kv.py's 2,121 tokens) fed as a `prefix`-token prefill, then one token per
    forward (teacher forced: every step attends over pages, through the decode kernel), the
    argmax of each step compared. KVDECK_ATTN_INT_V (read once per process) picks nvfp4's P·V."""
    from app.bench.kv import eval_ids
    from app.engine import default_models_dir, load_engine

    arg = {}
    for fmt in (ref, kv):
        eng = load_engine(default_models_dir() / model, weights=weights, kv=fmt, max_context=2304)
        ids = eval_ids(eng.tokenizer, 2121)
        seq = eng.native.open_sequence()
        try:
            eng._forward(seq, ids[:prefix])
            arg[fmt] = np.array([int(eng._forward(seq, [t]).argmax()) for t in ids[prefix:]])
        finally:
            eng.native.close_sequence(seq)
        del eng
    return {"kv": kv, "ref": ref, "weights": weights, "steps": int(arg[kv].size),
            "int_v": os.environ.get("KVDECK_ATTN_INT_V", "1") != "0",
            "top1": float((arg[kv] == arg[ref]).mean())}


def cpu_flags() -> dict:
    """The FLAGS this CPU reports (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            have = set()
            for line in f:
                if line.startswith(("flags", "Features")):
                    have.update(line.split(":", 1)[1].split())
    except OSError:
        have = set()
    return {f: f in have for f in FLAGS}


def _best(ops, *args, repeat, **kw) -> float:
    secs, _ = ops.attention_timing(*args, repeat=repeat, **kw)
    return min(secs)


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvdeck bench attention", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    ap.add_argument("--quick", action="store_true", help="SmolLM2 shape only, fewer repetitions")
    ap.add_argument("--fidelity", action="store_true",
                    help="only the top-1 of 1,535 real decode steps over nvfp4 pages against f16 pages")
    ap.add_argument("--prefill", action="store_true",
                    help="only prefill attention (500 over 4,000 cached), A/B: app/bench/attention_prefill.py")
    ap.add_argument("--against", metavar="SO", help="with --prefill: another build's _native .so, timed in the same run")
    ap.add_argument("--reps", type=int, default=3, help="with --prefill: repetitions (best of)")
    ap.add_argument("--engine", action="store_true", help="with --prefill: also the engine's 500-token tail over 3,700")
    args = ap.parse_args(argv)
    if args.prefill:
        from app.bench.attention_prefill import run as run_prefill

        return run_prefill(args)
    from app.engine import _native

    if args.fidelity:
        r = decode_fidelity()
        print(json.dumps(r) if args.json else
              f"decode top-1 {r['kv']} vs {r['ref']} KV ({r['weights']} weights, {r['steps']} steps, "
              f"integer P·V {'on' if r['int_v'] else 'off'}): {r['top1']:.4f}  load {os.getloadavg()[0]:.2f}")
        return 0

    say = (lambda *a: None) if args.json else print
    flags = cpu_flags()
    flags["kernels"] = _native.kernels.kernel_isa()
    out: dict = {"flags": flags, "load_before": os.getloadavg()[0], "validation": {}, "decode": [], "prefill": []}
    try:
        for kv in KV_FORMATS:
            out["validation"][kv] = validate(kv)
    except RuntimeError as e:
        print(f"validation failed: {e}", file=sys.stderr)
        return 1
    copy = {th: copy_bandwidth(th) for th in THREADS}  # the roofline of each thread count
    out["copy_gbs"] = {th: c / 1e9 for th, c in copy.items()}
    say(f"CPU flags: {' '.join(f for f in FLAGS if flags.get(f))} (kernels {flags['kernels']}); load {out['load_before']:.2f}; "
        f"copy bandwidth " + " / ".join(f"{c / 1e9:.1f}" for c in copy.values()) + " GB/s on "
        + " / ".join(str(th) for th in copy) + " threads; validation (max err / max|v|): "
        + ", ".join(f"{kv} {e:.1e}" for kv, e in out["validation"].items()))
    shapes = {"smollm2-135m": SHAPES["smollm2-135m"]} if args.quick else SHAPES
    reps = 3 if args.quick else 5

    say("\ndecode: one query after ctx tokens (µs per step; GB/s of KV read; fraction of copy bandwidth)")
    say(f"{'shape':14} {'ctx':>5} {'kv':6} {'thr':>3} {'layer µs':>9} {'model µs':>10} {'GB/s':>6} {'roofline':>8}")
    for name, (nh, nkv, D, layers) in shapes.items():
        for ctx in CONTEXTS:
            for kv in KV_FORMATS:
                for th in THREADS:
                    ops = _native.BackendOps("cpu", th)
                    one = _best(ops, nh, nkv, D, ctx - 1, 1, kv=kv, layers=1, repeat=10 * reps)
                    full = _best(ops, nh, nkv, D, ctx - 1, 1, kv=kv, layers=layers, repeat=reps)
                    gbs = step_bytes(kv, ctx, nkv, D, layers) / full / 1e9
                    row = dict(shape=name, ctx=ctx, kv=kv, threads=th, layer_us=one * 1e6, model_us=full * 1e6,
                               gbs=gbs, roofline=gbs * 1e9 / copy[th])
                    out["decode"].append(row)
                    say(f"{name:14} {ctx:5d} {kv:6} {th:3d} {one * 1e6:9.0f} {full * 1e6:10.0f} {gbs:6.1f} "
                        f"{row['roofline']:8.2f}")

    p0, M = PREFILL
    say(f"\nprefill attention: {M} new tokens over {p0} cached, every layer (ms)")
    for name, (nh, nkv, D, layers) in shapes.items():
        for kv in KV_FORMATS:
            for th in THREADS:
                ops = _native.BackendOps("cpu", th)
                t = _best(ops, nh, nkv, D, p0, M, kv=kv, layers=layers, repeat=2 if args.quick else 3)
                pairs = M * nh * (p0 + (M + 1) / 2) * layers  # (query head, key) pairs
                row = dict(shape=name, kv=kv, threads=th, cached=p0, new=M, ms=t * 1e3,
                           gflops=4 * D * pairs / t / 1e9)
                out["prefill"].append(row)
                say(f"{name:14} {kv:6} {th} threads {t * 1e3:8.1f} ms  {row['gflops']:6.1f} GFLOP/s")
    out["load_after"] = os.getloadavg()[0]
    say(f"\nload after: {out['load_after']:.2f}")
    if args.json:
        print(json.dumps(out, indent=1))
    return 0
