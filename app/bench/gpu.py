"""`kvdeck bench gpu [--json FILE] [--kernels] [--no-8b] [--no-seed] [--reps R]`: the engine on a CUDA GPU.

Through the real engine (app.engine._native.Engine on the "cuda" backend), random-weight models
in the engine's formats (app/bench/gpu_model.py: speed depends only on shapes and formats):
  * SmolLM2-135M-shaped (nvfp4 layers, w8a8 head, as the default folder): decode µs per token
    after a 64- and a 1024-token context for f16, nvfp4 and f32 KV (each step one forward of
    one token, greedy on the device: the graph replays, the token id comes back), the same
    with the [V] logits downloaded (what host-side sampling costs), without CUDA graphs (A/B),
    and prefill tok/s of a 512-token prompt; the CPU backend on the same machine beside it.
  * Llama-3-8B-shaped (nvfp4 layers and head, nvfp4 KV): decode µs/token after 16 and 4096
    tokens and prefill tok/s of 512 tokens, against the roofline (weight bytes + KV bytes read
    per token over the device copy bandwidth measured in the same run).
  * The seed-000 task (app/bench/gpu_seed.py): TTFT per call with the prefix cache on and off,
    on the CUDA and the CPU backend (--no-seed skips it).
  * Decode A/B (both models): without the context-bucket graphs (KVDECK_CUDA_CTX_BUCKETS=0).
  * Prefill A/B (both models): the same 512 tokens with KVDECK_CUDA_MMA=0, M > 8 matmuls as
    batch-8 GEMV chunks instead of the tensor-core GEMM (gemm_mma.cu); the 8B model also with
    KVDECK_CUDA_GEMM_NVFP4=i8 (NVFP4 on the int8 mma instead of the default f16 mma),
    interleaved with the default, and its ratio to llama.cpp's pp512.
  * --kernels: native/kernels/cuda/bench/run_bench.py (GEMV vs torch FP16 on the 8B shapes,
    decode attention at 4K / 16K / 32K), its summary folded in.
Each figure is the median of --reps timed repetitions after a warm-up. Device copy bandwidth:
torch's device-to-device copy of 1 GiB (read + write), when torch is present.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from app.bench import gpu_model, gpu_peer, gpu_seed
from app.engine import _native

ROOT = Path(__file__).resolve().parents[2]


def copy_gbs() -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 2**30 / statistics.median(times) / 1e9


def device_name() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def _ids(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(100, 30000, n).astype(np.int32)


def decode_us(eng, ctx: int, steps: int, reps: int, logits: bool = False) -> float:
    """Median µs per decode step after a ctx-token prefill (one sequence; steps per rep)."""
    s = eng.open_sequence(0)
    try:
        tok = eng.forward_greedy(s, _ids(ctx, 1), None)
        for _ in range(3):  # warm-up: the eager step, the capture, a replay
            tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
        per = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(steps):
                if logits:
                    tok = int(eng.forward(s, np.array([tok], np.int32), False, None).argmax())
                else:
                    tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
            per.append((time.perf_counter() - t0) / steps * 1e6)
        return statistics.median(per)
    finally:
        eng.close_sequence(s)


def prefill_s(eng, ids: np.ndarray) -> float:
    """Seconds of one prefill of ids in a fresh sequence (cache-free: forward_greedy of all ids)."""
    s = eng.open_sequence(0)
    try:
        t0 = time.perf_counter()
        eng.forward_greedy(s, ids, None)
        return time.perf_counter() - t0
    finally:
        eng.close_sequence(s)


def prefill_tps(eng, n: int, reps: int) -> float:
    ids = _ids(n, 2)
    times = [prefill_s(eng, ids) for _ in range(reps + 1)][1:]  # the first is a warm-up
    return n / statistics.median(times)


PREFILL_ARMS = {"new": {}, "rows=0": {"KVDECK_CUDA_PREFILL_ROWS": "0"}, "i8": {"KVDECK_CUDA_GEMM_NVFP4": "i8"}}


def prefill_ab(eng, n: int, reps: int) -> dict[str, float]:
    """Prefill tok/s (n tokens) per arm, interleaved rep by rep on the same engine (the switches
    are read at every launch): "new" the defaults (NVFP4 GEMM on the f16 mma, tiles made f16 in
    shared memory once per block), "rows=0" RoPE + KV
    write and the q8 quantisation of M > 8 rows on the per-item / per-block kernels
    (KVDECK_CUDA_PREFILL_ROWS=0, before session 7), "i8" NVFP4 on the int8 mma
    (KVDECK_CUDA_GEMM_NVFP4=i8); all validated by bench_gemm_mma and tests/cuda. Medians."""
    ids = _ids(n, 2)
    times: dict[str, list[float]] = {arm: [] for arm in PREFILL_ARMS}
    for r in range(reps + 1):
        for arm, env in PREFILL_ARMS.items():
            with gpu_model.switches(env):
                dt = prefill_s(eng, ids)
            if r:
                times[arm].append(dt)  # the first of each is a warm-up
    return {arm: n / statistics.median(t) for arm, t in times.items()}


LLAMA_CPP_PP512_8B = gpu_peer.RECORDED_PP512  # the A/B scripts' reference (decode_ab.py, prefill_ab.py)


def prefill_gemv_chunks(model: str, reps: int, **kw) -> float:
    """Prefill tok/s (512) with M > 8 matmuls as batch-8 GEMV chunks: the A/B of the tensor-core GEMM."""
    with gpu_model.switches({"KVDECK_CUDA_MMA": "0"}):
        eng = gpu_model.build(model, "nvfp4", "f16" if model.startswith("smollm2") else "nvfp4", "cuda", **kw)
    return prefill_tps(eng, 512, reps)


def ab_decode_us(env: dict, args: tuple, kw: dict, ctx: int, reps: int, steps: int = 64) -> float:
    """decode_us of an engine built (and its step recorded) under the opt-in switches env: the
    backend and the kernels read them when the backend is created (kernels_cuda.h)."""
    with gpu_model.switches(env):
        eng = gpu_model.build(*args, **kw)
    try:
        return decode_us(eng, ctx, steps, reps)
    finally:
        del eng


def smollm2(reps: int, out: dict) -> None:
    t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", seed=0)
    rows = []
    for kv in ("f16", "nvfp4", "f32"):
        eng = gpu_model.build("smollm2-135m", "nvfp4", kv, "cuda", tensors=t, max_context=4096)
        r = {"kv": kv, "weight_bytes": eng.weight_bytes, "kv_bytes_per_token": eng.kv_bytes_per_token}
        for ctx in (64, 1024):
            r[f"decode_us_{ctx}"] = decode_us(eng, ctx, 64, reps)
        r["decode_us_64_logits"] = decode_us(eng, 64, 64, reps, logits=True)
        r["prefill_tps_512"] = prefill_tps(eng, 512, reps)
        del eng
        rows.append(r)
        print(f"  smollm2 nvfp4/w8a8, {kv:5} KV: decode {r['decode_us_64']:7.1f} µs/token @64, "
              f"{r['decode_us_1024']:7.1f} @1024, {r['decode_us_64_logits']:7.1f} @64 with logits download; "
              f"prefill {r['prefill_tps_512']:8.0f} tok/s (512)", flush=True)
    with gpu_model.switches({"KVDECK_CUDA_GRAPH": "0"}):
        eng = gpu_model.build("smollm2-135m", "nvfp4", "f16", "cuda", tensors=t, max_context=4096)
    eager = decode_us(eng, 64, 64, reps)
    del eng
    print(f"  smollm2 f16 KV without CUDA graphs: decode {eager:7.1f} µs/token @64", flush=True)
    buckets = ab_decode_us({"KVDECK_CUDA_CTX_BUCKETS": "0"}, ("smollm2-135m", "nvfp4", "f16", "cuda"),
                           dict(tensors=t, max_context=4096), 64, reps)
    print(f"  smollm2 f16 KV without context-bucket graphs (KVDECK_CUDA_CTX_BUCKETS=0): decode {buckets:7.1f} "
          f"µs/token @64", flush=True)
    gemv_pf = prefill_gemv_chunks("smollm2-135m", reps, tensors=t, max_context=4096)
    print(f"  smollm2 f16 KV prefill with batch-8 GEMV chunks (KVDECK_CUDA_MMA=0): {gemv_pf:8.0f} tok/s (512)",
          flush=True)
    cpu = gpu_model.build("smollm2-135m", "nvfp4", "f16", "cpu", tensors=t, max_context=4096)
    cpu_us = decode_us(cpu, 64, 16, max(1, reps // 2))
    cpu_pf = prefill_tps(cpu, 512, 1)
    print(f"  smollm2 on the CPU backend ({cpu.threads} threads): decode {cpu_us:7.1f} µs/token @64, "
          f"prefill {cpu_pf:6.0f} tok/s", flush=True)
    out["smollm2"] = {"rows": rows, "decode_us_64_no_graph_f16": eager,
                      "decode_us_64_no_buckets_f16": buckets, "prefill_tps_512_gemv_chunks": gemv_pf,
                      "cpu_decode_us_64": cpu_us,
                      "cpu_prefill_tps_512": cpu_pf, "cpu_threads": cpu.threads}


def llama8b(reps: int, gbs: float | None, out: dict, peer: gpu_peer.PeerFigures) -> None:
    t0 = time.perf_counter()
    t = gpu_model.random_tensors("llama3-8b", "nvfp4", "nvfp4", seed=0, embed="f16")
    eng = gpu_model.build("llama3-8b", "nvfp4", "nvfp4", "cuda", tensors=t, head="nvfp4", max_context=8192,
                          embed="f16")
    wb = eng.weight_bytes - 128256 * 4096 * 2  # the embedding table is read one row a token
    r = {"weight_bytes_read": wb, "kv_bytes_per_token": eng.kv_bytes_per_token, "build_s": time.perf_counter() - t0}
    for ctx in (16, 4096):
        us = decode_us(eng, ctx, 32, reps)
        r[f"decode_us_{ctx}"] = us
        if gbs:
            floor = (wb + ctx * eng.kv_bytes_per_token) / (gbs * 1e9) * 1e6
            r[f"roofline_us_{ctx}"] = floor
            r[f"roofline_fraction_{ctx}"] = floor / us
    ab = prefill_ab(eng, 512, max(2, reps // 2))
    r["prefill_tps_512"], r["prefill_tps_512_nvfp4_i8"] = ab["new"], ab["i8"]
    r["prefill_tps_512_rows_off"] = ab["rows=0"]
    r["prefill_vs_llama_cpp"] = r["prefill_tps_512"] / peer.pp512
    r["decode_16_vs_llama_cpp"] = 1e6 / r["decode_us_16"] / peer.tg128
    if peer.tg128_4096:
        r["decode_4096_vs_llama_cpp"] = 1e6 / r["decode_us_4096"] / peer.tg128_4096
    r["llama_cpp"] = {"pp512": peer.pp512, "tg128": peer.tg128, "tg128_4096": peer.tg128_4096, "source": peer.source}
    del eng
    kw8 = dict(tensors=t, head="nvfp4", max_context=8192, embed="f16")
    r["decode_us_16_no_buckets"] = ab_decode_us({"KVDECK_CUDA_CTX_BUCKETS": "0"}, ("llama3-8b", "nvfp4", "nvfp4", "cuda"),
                                                kw8, 16, reps, steps=32)
    r["prefill_tps_512_gemv_chunks"] = prefill_gemv_chunks("llama3-8b", 1, tensors=t, head="nvfp4",
                                                           max_context=8192, embed="f16")
    del t
    out["llama3_8b"] = r
    print(f"  llama.cpp (Q4_0, flash attention on): pp512 {peer.pp512:.0f} tok/s, tg128 {peer.tg128:.1f} tok/s"
          + (f", tg128 after 4096 {peer.tg128_4096:.1f}" if peer.tg128_4096 else "") + f"; {peer.source}", flush=True)
    for ctx in (16, 4096):
        frac = f", {r[f'roofline_fraction_{ctx}']:.2f} of roofline ({r[f'roofline_us_{ctx}']:.0f} µs)" if gbs else ""
        vs = {16: r["decode_16_vs_llama_cpp"], 4096: r.get("decode_4096_vs_llama_cpp")}[ctx]
        print(f"  llama3-8b nvfp4, nvfp4 KV: decode {r[f'decode_us_{ctx}']:8.1f} µs/token "
              f"({1e6 / r[f'decode_us_{ctx}']:6.1f} tok/s) @{ctx}{frac}"
              + (f", {vs:.2f}x llama.cpp" if vs else ""), flush=True)
    print(f"  llama3-8b decode without context-bucket graphs (KVDECK_CUDA_CTX_BUCKETS=0): "
          f"{r['decode_us_16_no_buckets']:8.1f} µs/token @16", flush=True)
    print(f"  llama3-8b prefill {r['prefill_tps_512']:8.0f} tok/s (512) = {r['prefill_vs_llama_cpp']:.2f}x llama.cpp "
          f"(pp512 {peer.pp512:.0f}, fa on); NVFP4 on the int8 mma (KVDECK_CUDA_GEMM_NVFP4=i8, "
          f"interleaved) {r['prefill_tps_512_nvfp4_i8']:8.0f}; per-item RoPE + KV and per-block q8 kernels "
          f"(KVDECK_CUDA_PREFILL_ROWS=0) {r['prefill_tps_512_rows_off']:8.0f}; batch-8 GEMV chunks (KVDECK_CUDA_MMA=0) "
          f"{r['prefill_tps_512_gemv_chunks']:8.0f} tok/s", flush=True)


def kernels(out: dict) -> None:
    f = Path(os.environ.get("TMPDIR", "/tmp")) / "kvdeck_run_bench.json"
    r = subprocess.run([sys.executable, str(ROOT / "native/kernels/cuda/bench/run_bench.py"), "--json", str(f)],
                       text=True, timeout=900)
    if r.returncode == 0 and f.is_file():
        out["kernels"] = json.loads(f.read_text()).get("summary")


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvdeck bench gpu")
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    ap.add_argument("--kernels", action="store_true", help="also the kernel-level run_bench.py")
    ap.add_argument("--no-8b", action="store_true", help="skip the Llama-3-8B-shaped model")
    ap.add_argument("--no-seed", action="store_true", help="skip the seed-000 task (cache on / off)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peer", type=Path, default=None,
                    help="llama-bench -o jsonl output of the llama.cpp peer run on this GPU (else its recorded figures)")
    args = ap.parse_args(argv)
    try:
        peer = gpu_peer.read_jsonl(args.peer) if args.peer else gpu_peer.recorded()
    except (OSError, ValueError) as e:
        print(f"bench gpu: --peer: {e}", file=sys.stderr)
        return 2
    if "cuda" not in _native.backends():
        why = "this build has no CUDA backend" if "cuda" not in _native.built_backends() else "no usable GPU"
        print(f"bench gpu: {why}", file=sys.stderr)
        return 2
    out: dict = {"device": device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    gbs = copy_gbs()
    out["copy_gbs"] = gbs
    print(f"device: {out['device']}; copy {gbs or 0:.0f} GB/s (read + write)", flush=True)
    smollm2(args.reps, out)
    if not args.no_seed:
        gpu_seed.seed000(out)
    if not args.no_8b:
        llama8b(args.reps, gbs, out, peer)
    if args.kernels:
        kernels(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0
