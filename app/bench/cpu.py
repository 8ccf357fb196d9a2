"""`kvdeck bench cpu [--json] [--threads N] [--reps R] [--quick]`: end-to-end CPU speed vs llama.cpp.

For each kvdeck weight format (nvfp4, w4a8, f16) of SmolLM2-135M:
  * prefill tok/s for a 512- and a 2048-token prompt (cold sequence, last-token logits);
  * decode tok/s for 128 tokens after a 32-token and after a 2048-token context
    (one token per call, last-token logits each call; the token ids are given, not sampled).
When llama-cpp-python is installed (`pip install -e '.[bench]'`), the same four figures for
llama.cpp on the same weights requantised to Q4_0 (its fastest 4-bit CPU path; made once
from the shipped Q4_1 GGUF with allow_requantize and cached beside it) and on the shipped
Q4_1 file; every kvdeck figure is also given as a ratio to llama.cpp Q4_0 of the same run.

Fairness: the same thread count for both (all cores unless --threads), the same token ids
(fixed-seed random ids from the ordinary vocabulary), llama.cpp with n_batch = n_ubatch =
the longest prompt (one graph per prefill, as ours), a warm-up run of every measurement,
and the median of --reps repetitions. Both sides compute logits of the last token only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

MODEL = "smollm2-135m"
FORMATS = ("nvfp4", "w4a8", "f16")
PREFILL = (512, 2048)           # prompt lengths
DECODE_CTX = (32, 2048)         # context before the decode run
DECODE_TOKENS = 128
N_CTX = 4096                    # both engines: room for 2048 + 128 with margin
KV = "f16"                      # our KV pages in f16, as llama.cpp's default cache type
SEED = 1234
TOKEN_RANGE = (256, 49000)      # ordinary (non-special) ids of the SmolLM2 vocabulary
GGUF_DIR = Path("models/weights/_downloads")
GGUF_Q41 = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_Q40 = "SmolLM2-135M-Instruct.Q4_0.gguf"   # made from GGUF_Q41, cached
INSTALL_HINT = "pip install -e '.[bench]'   (llama-cpp-python: compiles llama.cpp, a few minutes)"


# ============================================================================
# Machine facts
# ============================================================================
def cpu_facts() -> dict:
    """CPU model and the SIMD flags that matter to both engines (from /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = val.strip()
            if key.strip() in ("flags", "Features"):
                flags = set(val.split())
    except OSError:
        pass
    keep = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512bw",
            "avx512vl", "avx512_vnni", "avx512_bf16", "amx_int8", "asimd", "asimddp", "i8mm", "sve")
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in keep if f in flags]}


def _median_rate(fn, n_tokens: int, reps: int) -> float:
    """tok/s: one warm-up call of fn, then the median of reps timed calls (fn returns seconds)."""
    fn()
    return n_tokens / statistics.median(fn() for _ in range(reps))


# ============================================================================
# kvdeck
# ============================================================================
def bench_kvdeck(fmt: str, ids: np.ndarray, threads: int, reps: int) -> dict:
    from app.engine import load_engine

    eng = load_engine(MODEL, weights=fmt, kv=KV, threads=threads, max_context=N_CTX)
    nat = eng.native

    def prefill(n: int) -> float:
        seq = nat.open_sequence()
        try:
            t0 = time.perf_counter()
            nat.forward(seq, ids[:n], False)
            return time.perf_counter() - t0
        finally:
            nat.close_sequence(seq)

    def decode(ctx: int) -> float:
        seq = nat.open_sequence()
        try:
            nat.forward(seq, ids[:ctx], False)
            steps = ids[ctx:ctx + DECODE_TOKENS]
            t0 = time.perf_counter()
            for i in range(DECODE_TOKENS):
                nat.forward(seq, steps[i:i + 1], False)
            return time.perf_counter() - t0
        finally:
            nat.close_sequence(seq)

    out = {f"prefill_{n}": _median_rate(lambda n=n: prefill(n), n, reps) for n in PREFILL}
    out.update({f"decode_{c}": _median_rate(lambda c=c: decode(c), DECODE_TOKENS, reps) for c in DECODE_CTX})
    out["isa"] = _isa()
    return out


def _isa() -> str:
    from app.engine import _native
    return _native.kernels.kernel_isa()


# ============================================================================
# llama.cpp (llama-cpp-python), the peer
# ============================================================================
def _llama_cpp():
    try:
        import llama_cpp
        return llama_cpp
    except ImportError:
        return None


def ensure_q4_0(llama_cpp, src: Path, dst: Path, threads: int) -> Path:
    """Requantise the shipped Q4_1 GGUF to Q4_0 once (allow_requantize); cached at dst."""
    if dst.exists():
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = threads
    tmp = dst.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} failed ({rc})")
    tmp.rename(dst)
    return dst


def _memory_clear(llama_cpp, ctx) -> None:
    if hasattr(llama_cpp, "llama_memory_clear"):
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    elif hasattr(llama_cpp, "llama_kv_self_clear"):
        llama_cpp.llama_kv_self_clear(ctx)
    else:
        llama_cpp.llama_kv_cache_clear(ctx)


def bench_llama(llama_cpp, path: Path, ids: np.ndarray, threads: int, reps: int) -> dict:
    """The four figures for one GGUF file, through llama.cpp's C API (llama_decode with
    llama_batch_get_one: logits of the last token only, as ours)."""
    nb = max(PREFILL)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=nb, n_ubatch=nb,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    ctx = llm.ctx
    tok = (llama_cpp.llama_token * len(ids))(*[int(t) for t in ids])

    def run(start: int, n: int) -> None:
        batch = llama_cpp.llama_batch_get_one(llama_cpp.ctypes.cast(
            llama_cpp.ctypes.byref(tok, start * llama_cpp.ctypes.sizeof(llama_cpp.llama_token)),
            llama_cpp.ctypes.POINTER(llama_cpp.llama_token)), n)
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc})")
        llama_cpp.llama_get_logits_ith(ctx, -1)

    def prefill(n: int) -> float:
        _memory_clear(llama_cpp, ctx)
        t0 = time.perf_counter()
        run(0, n)
        llama_cpp.llama_synchronize(ctx)
        return time.perf_counter() - t0

    def decode(c: int) -> float:
        _memory_clear(llama_cpp, ctx)
        run(0, c)
        t0 = time.perf_counter()
        for i in range(DECODE_TOKENS):
            run(c + i, 1)
        llama_cpp.llama_synchronize(ctx)
        return time.perf_counter() - t0

    try:
        out = {f"prefill_{n}": _median_rate(lambda n=n: prefill(n), n, reps) for n in PREFILL}
        out.update({f"decode_{c}": _median_rate(lambda c=c: decode(c), DECODE_TOKENS, reps)
                    for c in DECODE_CTX})
    finally:
        llm.close() if hasattr(llm, "close") else None
    out["version"] = getattr(llama_cpp, "__version__", "?")
    try:
        out["system_info"] = llama_cpp.llama_print_system_info().decode()
    except Exception:  # informative only
        pass
    return out


# ============================================================================
# Command
# ============================================================================
FIGURES = [f"prefill_{n}" for n in PREFILL] + [f"decode_{c}" for c in DECODE_CTX]
LABELS = {"prefill_512": "prefill 512", "prefill_2048": "prefill 2048",
          "decode_32": "decode@32", "decode_2048": "decode@2048"}


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvdeck bench cpu", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both engines")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per figure (median)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="kvdeck formats to run")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    args = ap.parse_args(argv)
    say = (lambda *a: None) if args.json else print

    rng = np.random.default_rng(SEED)
    ids = rng.integers(*TOKEN_RANGE, size=max(max(PREFILL), max(DECODE_CTX)) + DECODE_TOKENS,
                       dtype=np.int32)
    facts = cpu_facts()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    out = {"model": MODEL, "threads": args.threads, "kv": KV, "reps": args.reps, "cpu": facts,
           "load_avg_1min_before": load, "decode_tokens": DECODE_TOKENS, "kvdeck": {}, "llama_cpp": None}
    say(f"kvdeck bench cpu — {MODEL}, {args.threads} threads (both engines), median of {args.reps} "
        f"after a warm-up; same token ids (seed {SEED}); KV cache f16 (both engines)")
    say(f"CPU: {facts['model']}, {facts['cores']} cores; flags: {' '.join(facts['flags'])}; "
        f"load {load:.2f}" if load is not None else "")

    lc = None if args.no_peer else _llama_cpp()
    if lc is not None:
        src = GGUF_DIR / GGUF_Q41
        if not src.exists():
            say(f"llama.cpp: {src} missing (run `kvdeck models fetch {MODEL}`); peer skipped")
            lc = None
    if lc is not None:
        q40 = ensure_q4_0(lc, src, GGUF_DIR / GGUF_Q40, args.threads)
        out["llama_cpp"] = {"Q4_0": bench_llama(lc, q40, ids, args.threads, args.reps),
                            "Q4_1": bench_llama(lc, src, ids, args.threads, args.reps),
                            "n_batch": max(PREFILL), "n_ubatch": max(PREFILL)}
    elif not args.no_peer:
        say(f"llama.cpp peer: llama-cpp-python is not installed; to compare, {INSTALL_HINT}")

    for fmt in args.formats.split(","):
        out["kvdeck"][fmt] = bench_kvdeck(fmt, ids, args.threads, args.reps)

    ref = out["llama_cpp"]["Q4_0"] if out["llama_cpp"] else None
    if ref:
        for fmt, r in out["kvdeck"].items():
            r["ratio_to_llama_q4_0"] = {f: r[f] / ref[f] for f in FIGURES}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0

    say(f"\n{'tok/s':<22}" + "".join(f"{LABELS[f]:>20}" for f in FIGURES))
    for fmt, r in out["kvdeck"].items():
        cells = []
        for f in FIGURES:
            ratio = f" ({r[f] / ref[f]:.2f}x)" if ref else ""
            cells.append(f"{r[f]:.0f}{ratio}")
        say(f"{'kvdeck ' + fmt + ' [' + r['isa'] + ']':<22}" + "".join(f"{c:>20}" for c in cells))
    if out["llama_cpp"]:
        for q in ("Q4_0", "Q4_1"):
            r = out["llama_cpp"][q]
            say(f"{'llama.cpp ' + q:<22}" + "".join(f"{r[f]:>20.0f}" for f in FIGURES))
        say(f"(ratios: kvdeck / llama.cpp Q4_0 of this run; llama.cpp {ref['version']}, "
            f"n_batch = n_ubatch = {max(PREFILL)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
