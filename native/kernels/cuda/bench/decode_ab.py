"""Interleaved A/B of the decode step's switches in one process (on a CUDA machine).

    python3 native/kernels/cuda/bench/decode_ab.py [smollm2] [8b [pf8b]] [--reps R] [--host [--each]]

Each variant is an engine built with its environment switches set (the backend reads them
when it is created; the CUDA graph is captured under them); the same random tensors serve
every variant of a model. Repetitions
alternate between the variants (R rounds of `steps` greedy decode steps each, median per
variant), so a drift of the machine hits all alike; the timed steps stay inside one context
bucket of the step key (backend.h step_begin). SmolLM2-135M-shaped: nvfp4 layers, w8a8
head, f16 KV, after a 64-token prompt; Llama-3-8B-shaped: nvfp4 layers and head, nvfp4 KV,
after 16 tokens, with the roofline of app/bench/gpu.py (weights + KV bytes over the copy).

--make-tensors DIR: only write the 8B's random tensors to DIR/8b.pkl (needs no engine module: a
device session makes them while the module builds); --tensors DIR: read them from there.
--host: the host-path arms instead (the packed upload and pinned token download against the old
path; --each: also each half alone) and the split of a step into GPU and host time: the
STEP_TIMING arm's backend times each replay (backend_cuda_state.h StepTiming: events around the
graph, host clocks) and, after the rounds, launches each of up to `steps` more steps' graph twice
back to back (KVDECK_CUDA_STEP_B2B) to time the graph with no host gap before it; host share =
the defaults arm's wall - that.
"""

from __future__ import annotations

import gc
import os
import pickle
import statistics
import sys
import tempfile
import time

import numpy as np

if __name__ == "__main__" and "--make-tensors" in sys.argv:  # runs before the engine module is built
    import types

    _engine = types.ModuleType("app.engine")
    _engine._native = types.ModuleType("app.engine._native")
    _loader = types.ModuleType("app.engine.loader")
    _loader.upload_arrays = None
    sys.modules.update({"app.engine": _engine, "app.engine.loader": _loader})
from app.bench import gpu_model  # noqa: E402

SMOL = [("defaults", {}),
        ("ATTN_Q8=0 (o's q8 kernel: session 6's step)", {"KVDECK_CUDA_ATTN_Q8": "0"}),
        ("COMBINE_TRIGGER=0 (q8 in the combine, no trigger)", {"KVDECK_CUDA_COMBINE_TRIGGER": "0"}),
        ("GEMV_GU=1 (gate/up at four chunks a lane, not pipelined)", {"KVDECK_CUDA_GEMV_GU": "1"})]
BIG = [("defaults", {}),
       ("ATTN_FUSED=0 (split kernel + combine: session 8's step)", {"KVDECK_CUDA_ATTN_FUSED": "0"}),
       ("COMBINE_TRIGGER=0 (fused, o GEMV not triggered early)", {"KVDECK_CUDA_COMBINE_TRIGGER": "0"}),
       ("GEMV_GU=0 (gate/up pipelined at two chunks: session 7's step)", {"KVDECK_CUDA_GEMV_GU": "0"})]

# the session-7 host path: four uploads a step, the token downloaded into pageable memory, a
# publish every forward (engine.cpp Scratch::pack, backend_cuda_state.h pinned_dl_)
OLD_HOST = {"KVDECK_STEP_PACK": "0", "KVDECK_CUDA_PINNED_DL": "0"}
TIMING = "KVDECK_CUDA_STEP_TIMING"


def host_arms(timing_path: str, each: bool):
    """each: also each half of the old host path alone."""
    arms = [("defaults", {}), ("old host path (STEP_PACK=0, PINNED_DL=0)", OLD_HOST)]
    if each:
        arms += [("STEP_PACK=0 only (four uploads, publish each call)", {"KVDECK_STEP_PACK": "0"}),
                 ("PINNED_DL=0 only (pageable token download)", {"KVDECK_CUDA_PINNED_DL": "0"})]
    return arms + [("STEP_TIMING (defaults + events and clocks)", {TIMING: timing_path})]


def python_floor_us(eng, n: int = 20000) -> float:
    """µs per iteration of the Python side of a step without the engine: the token's array and a
    bound call returning an int (the binding's floor)."""
    tok, t0 = 7, time.perf_counter()
    for _ in range(n):
        a = np.array([tok], np.int32)
        tok = eng.kv_bytes_per_token + int(a.size) - 1 - eng.kv_bytes_per_token + 7
    return (time.perf_counter() - t0) / n * 1e6


def split(name: str, wall_us: float, timing_wall: float, path: str, py_us: float) -> None:
    if not os.path.exists(path):
        print(f"  {name} split: no timing file (not a CUDA backend?)", flush=True)
        return
    t = {k: float(v) for k, v in (f.split("=") for f in open(path).read().split())}
    g, b = t["gpu_us"], t["gpu_b2b_us"]
    print(f"  {name} split: wall {wall_us:.1f} µs/token (defaults arm; {timing_wall:.1f} with the timing); GPU "
          f"back-to-back {b:.1f} ({t['b2b_n']:.0f} steps), after an idle stream {g:.1f} ({t['replays']:.0f}); "
          f"host share {wall_us - b:.1f} µs = {(wall_us - b) / wall_us:.1%}: outside the backend "
          f"{t['outside_us']:.1f} (median; Python + binding + engine + uploads; Python + binding floor {py_us:.2f}; "
          f"timing arm's wall - launch - wait {timing_wall - t['launch_us'] - t['wait_us']:.1f}), cudaGraphLaunch "
          f"{t['launch_us']:.1f}, launch return -> sync return {t['wait_us']:.1f} (GPU + token D2H + wake-up; "
          f"beyond the idle-stream GPU time {t['wait_us'] - g:+.1f})", flush=True)


def build(env: dict, *args, **kw):
    with gpu_model.switches(env):  # read at backend creation
        return gpu_model.build(*args, **kw)


def ab(name: str, variants, make, ctx: int, steps: int, reps: int, floor=None, after=None) -> dict:
    """floor: engine -> the roofline µs of its step (or None); after: called with the first
    variant's engine once the decode rounds are done (the 32-layer prefill A/B)."""
    runs = []
    for label, env in variants:
        eng = build(env, *make[0], **make[1])
        s = eng.open_sequence(0)
        with gpu_model.switches(env):  # the eager step and the capture run under the switches too
            tok = eng.forward_greedy(s, np.random.default_rng(1).integers(100, 30000, ctx).astype(np.int32), None)
            for _ in range(3):
                tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
        runs.append([label, eng, s, tok, []])
    for _ in range(reps):
        for r in runs:
            eng, s, tok = r[1], r[2], r[3]
            t0 = time.perf_counter()
            for _ in range(steps):
                tok = eng.forward_greedy(s, np.array([tok], np.int32), None)
            r[4].append((time.perf_counter() - t0) / steps * 1e6)
            r[3] = tok
    timed = [r for r, (_, env) in zip(runs, variants) if TIMING in env]
    n_b2b = max(4, min(steps, 250 - (ctx + 3 + reps * steps)))  # inside the 256 context bucket
    for r in timed:  # the back-to-back GPU time: each graph launched twice, the second timed
        os.environ["KVDECK_CUDA_STEP_B2B"] = "1"
        try:
            for _ in range(n_b2b):
                r[3] = r[1].forward_greedy(r[2], np.array([r[3]], np.int32), None)
        finally:
            os.environ.pop("KVDECK_CUDA_STEP_B2B", None)
    py_us = python_floor_us(runs[0][1]) if timed else 0.0
    out = {}
    base = statistics.median(runs[0][4])
    floor_us = floor(runs[0][1]) if floor else None
    for label, eng, s, _, t in runs:
        us = statistics.median(t)
        out[label] = us
        roof = f", {floor_us / us:.3f} of roofline" if floor_us else ""
        print(f"  {name} {label:48s} {us:8.1f} µs/token (min {min(t):7.1f}; x{base / us:5.3f} vs the first){roof}",
              flush=True)
        eng.close_sequence(s)
    if after:
        after(runs[0][1])
    if timed:
        labels = [r[0] for r in timed]
        runs.clear(), timed.clear()
        eng = s = r = None  # noqa: F841 (the last references to the engines)
        gc.collect()  # the backends write their timing files when destroyed
        for label in labels:
            split(name, out["defaults"], out[label], dict(variants)[label][TIMING], py_us)
    return out


def tensors_8b(argv: list[str]):
    t0 = time.perf_counter()
    path = argv[argv.index("--tensors") + 1] + "/8b.pkl" if "--tensors" in argv else None
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            t = pickle.load(f)
    else:
        t = gpu_model.random_tensors("llama3-8b", "nvfp4", "nvfp4", seed=0, embed="f16")
    print(f"  (8b tensors {time.perf_counter() - t0:.1f} s{', read from ' + path if path else ''})", flush=True)
    return t


def main(argv: list[str]) -> int:
    if "--make-tensors" in argv:
        d = argv[argv.index("--make-tensors") + 1]
        t = gpu_model.random_tensors("llama3-8b", "nvfp4", "nvfp4", seed=0, embed="f16")
        with open(d + "/8b.pkl.tmp", "wb") as f:
            pickle.dump(t, f, protocol=5)
        os.replace(d + "/8b.pkl.tmp", d + "/8b.pkl")
        return 0
    from app.bench import gpu

    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 7
    host = "--host" in argv
    tmp = tempfile.mkdtemp()
    gbs = gpu.copy_gbs()
    print(f"device: {gpu.device_name()}; copy {gbs or 0:.0f} GB/s", flush=True)
    if "smollm2" in argv:
        t = gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", seed=0)
        arms = host_arms(f"{tmp}/smol.txt", "--each" in argv) if host else SMOL
        ab("smollm2 f16 KV @64", arms, (("smollm2-135m", "nvfp4", "f16", "cuda"), dict(tensors=t, max_context=4096)),
           64, 24, reps)  # 64 + 3 + 7 x 24 tokens: one context bucket (256)
    if "8b" in argv:
        t = tensors_8b(argv)
        mid = 16 + reps * 32 // 2  # the context half way through the timed steps

        def floor(eng):
            wb = eng.weight_bytes - 128256 * 4096 * 2  # the embedding table: one row a token
            return (wb + mid * eng.kv_bytes_per_token) / (gbs * 1e9) * 1e6 if gbs else None

        def prefill(eng):  # pf8b: bench gpu's 32-layer prefill A/B (new GEMM, v1, NVFP4 on the f16 mma)
            pf = gpu.prefill_ab(eng, 512, 3)
            print("  8b prefill 512, 32 layers, interleaved: " + ", ".join(
                f"{arm} {tps:7.0f} tok/s (x{tps / pf['new']:.3f})" for arm, tps in pf.items())
                + f"; new = {pf['new'] / gpu.LLAMA_CPP_PP512_8B:.3f}x llama.cpp pp512", flush=True)

        arms = host_arms(f"{tmp}/8b.txt", "--each" in argv) if host else BIG
        ab("8b nvfp4 KV @16", arms, (("llama3-8b", "nvfp4", "nvfp4", "cuda"),
                                     dict(tensors=t, head="nvfp4", max_context=8192, embed="f16")), 16, 32, reps, floor,
           prefill if "pf8b" in argv else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
