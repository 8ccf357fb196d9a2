"""`kvdeck bench attention --prefill [--against PATH] [--reps N] [--engine]`: prefill attention.

The seed-000 shape: a tail of 500 new tokens attending over 4,000 cached ones, attention alone
(BackendOps.attention_timing, every layer of SmolLM2-135M: 9 q heads, 3 KV heads, D 64, 30
layers), f16 and nvfp4 KV, on 1 and 2 threads. --against PATH times another build's
_native module (a .so file, e.g. a copy of the session's starting build) in the same run:
each repetition runs ours then theirs, each in a fresh process (a module is loaded by path
there), and the machine's load is printed with every figure; the best of --reps is reported
with the ratio, and the CPU seconds of a pass (summed over the threads; far steadier under other
processes' load than the wall time) with theirs over ours. --engine adds the end-to-end figure: a 500-token tail over ~3,700 cached
tokens through the engine (nvfp4 weights, prefix cache: the prompt's cached pages matched,
the tail computed: GEMMs and attention), best of --reps, ours against theirs likewise.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

PREFILL = (4000, 500)  # cached tokens, new tokens
SHAPE = (9, 3, 64, 30)  # SmolLM2-135M: q heads, KV heads, D, layers
ENGINE = (3700, 500)    # the engine figure: cached prefix, tail

_LOAD = """
import importlib.util, json, os, sys
so = {so!r}
if so:
    spec = importlib.util.spec_from_file_location("_native", so)
    nat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nat)
    sys.modules["app.engine._native"] = nat  # load_engine then uses this build
else:
    from app.engine import _native as nat
"""

_ATTN = _LOAD + """
import time
ops = nat.BackendOps("cpu", {threads})
cpu = []
for repeat in (1, 1 + {repeat}):  # the CPU time of {repeat} passes: the difference (setup cancels)
    c = time.process_time()
    secs, _ = ops.attention_timing({nh}, {nkv}, {D}, {p0}, {M}, kv={kv!r}, layers={layers}, repeat=repeat)
    cpu.append(time.process_time() - c)
print(json.dumps([min(secs), (cpu[1] - cpu[0]) / {repeat}]))
"""

_ENGINE = _LOAD + """
import time
import numpy as np
from app.engine import default_models_dir, load_engine
eng = load_engine(default_models_dir() / "smollm2-135m", kv={kv!r}, threads={threads}, max_context=4608)
nat_e, V = eng.native, eng.config.vocab_size
ids = np.random.default_rng(7).integers(1000, V, {p0} + {M}).astype(np.int32)
seq = nat_e.open_sequence()
nat_e.forward(seq, ids[:{p0}], False)
nat_e.finish(seq)  # the prefix's whole pages into the cache
best, cached = float("inf"), 0
for _ in range({repeat}):
    seq = nat_e.open_sequence()
    cached = nat_e.begin(seq, ids)
    t = time.perf_counter()
    nat_e.forward(seq, ids[cached:], False)
    best = min(best, time.perf_counter() - t)
    nat_e.close_sequence(seq)
print(json.dumps([best, int(cached)]))
"""


def _run(code: str) -> object:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark process failed: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def attention_seconds(so: str | None, kv: str, threads: int, repeat: int = 1) -> tuple[float, float]:
    """(best wall seconds of a pass over every layer, CPU seconds of a pass summed over the
    threads): under other processes' load the CPU time moves far less than the wall time."""
    nh, nkv, D, layers = SHAPE
    p0, M = PREFILL
    wall, cpu = _run(_ATTN.format(so=so, threads=threads, nh=nh, nkv=nkv, D=D, p0=p0, M=M, kv=kv,
                                  layers=layers, repeat=repeat))
    return float(wall), float(cpu)


def engine_seconds(so: str | None, kv: str, threads: int, repeat: int = 2) -> tuple[float, int]:
    p0, M = ENGINE
    best, cached = _run(_ENGINE.format(so=so, kv=kv, threads=threads, p0=p0, M=M, repeat=repeat))
    return float(best), int(cached)


def run(args) -> int:
    """args: the parsed `bench attention` arguments (prefill, against, reps, engine, json)."""
    against = args.against
    if against and not os.path.isfile(against):
        print(f"--against: no such file {against}", file=sys.stderr)
        return 2
    kvs, threads = ("f16", "nvfp4"), (2, 1)
    say = (lambda *a: None) if args.json else print
    rows: dict = {}
    p0, M = PREFILL
    say(f"prefill attention: {M} new tokens over {p0} cached, {SHAPE[3]} layers (s); "
        + (f"A/B against {against}" if against else "this build only"))
    for rep in range(args.reps):
        for th in threads:
            for kv in kvs:
                r = rows.setdefault(f"attention {kv} {th}t", {"ours": [], "theirs": [], "load": [],
                                                               "cpu_ours": [], "cpu_theirs": []})
                r["load"].append(os.getloadavg()[0])
                w, c = attention_seconds(None, kv, th)
                r["ours"].append(w), r["cpu_ours"].append(c)
                if against:
                    w, c = attention_seconds(against, kv, th)
                    r["theirs"].append(w), r["cpu_theirs"].append(c)
                say(f"  rep {rep + 1} {kv:5} {th} threads: ours {r['ours'][-1]:.3f} s (cpu {r['cpu_ours'][-1]:.2f})"
                    + (f"  theirs {r['theirs'][-1]:.3f} s (cpu {r['cpu_theirs'][-1]:.2f})  ratio "
                       f"{r['theirs'][-1] / r['ours'][-1]:.2f} (cpu {r['cpu_theirs'][-1] / r['cpu_ours'][-1]:.2f})"
                       if against else "")
                    + f"  load {r['load'][-1]:.2f}")
        if args.engine:
            for kv in kvs:
                r = rows.setdefault(f"engine {kv} 2t", {"ours": [], "theirs": [], "load": []})
                r["load"].append(os.getloadavg()[0])
                s, cached = engine_seconds(None, kv, 2)
                r["ours"].append(s)
                r["cached"] = cached
                if against:
                    r["theirs"].append(engine_seconds(against, kv, 2)[0])
                say(f"  rep {rep + 1} engine tail ({ENGINE[0] + ENGINE[1] - cached} computed over {cached} cached), "
                    f"{kv} KV, 2 threads: ours {r['ours'][-1]:.3f}"
                    + (f"  theirs {r['theirs'][-1]:.3f}  ratio {r['theirs'][-1] / r['ours'][-1]:.2f}" if against else "")
                    + f"  load {r['load'][-1]:.2f}")
    say(f"best of {args.reps}:")
    for name, r in rows.items():
        r["best_ours"] = min(r["ours"])
        if against:
            r["best_theirs"] = min(r["theirs"])
            r["ratio"] = r["best_theirs"] / r["best_ours"]
        cpu = ""
        if r.get("cpu_ours"):
            r["best_cpu_ours"] = min(r["cpu_ours"])
            cpu = f", cpu {r['best_cpu_ours']:.2f}"
            if against:
                r["best_cpu_theirs"] = min(r["cpu_theirs"])
                cpu += f" / {r['best_cpu_theirs']:.2f} = {r['best_cpu_theirs'] / r['best_cpu_ours']:.2f}"
        say(f"  {name:18} ours {r['best_ours']:.3f} s"
            + (f"  theirs {r['best_theirs']:.3f} s  ratio {r['ratio']:.2f}" if against else "")
            + f"{cpu}  (load {min(r['load']):.2f}-{max(r['load']):.2f})")
    if args.json:
        print(json.dumps({"against": against, "rows": rows}, indent=1))
    return 0
