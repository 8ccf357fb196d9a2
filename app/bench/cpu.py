"""`kvdeck bench cpu [--json] [--threads N] [--reps R] [--quick] [--load N,...]`: CPU speed vs llama.cpp.

Table mode (the default), for each kvdeck weight format (nvfp4, w4a8, f16) of SmolLM2-135M:
  * prefill tok/s of a 512- and a 2048-token prompt (cold sequence, last-token logits);
  * decode tok/s of 128 one-token calls after a 32- and after a 2048-token context (the timed
    2048-token prefill is the context of the decode after it); `--decode-ctx 32,2048,8192` adds
    longer contexts.
The peer is llama.cpp (llama-cpp-python, app/bench/peer.py) on the same weights as Q4_0, in four
settings: flash attention off/on x n_ubatch 512/2048. Its best setting per figure is the
reference of every ratio, and the setting that won is printed beside it.

Load mode (`--load 0,1,2`): decode after 32 tokens, ours (the first --formats entry) and the
peer (Q4_0, flash attention off and on: n_ubatch cannot matter to a one-token batch), with N
busy-looping processes beside them (app/bench/load.py); each figure also as a ratio to the same
engine's idle figure. Level 0 is always measured.

Fairness: the same thread count for both (all cores unless --threads), the same token ids
(fixed-seed random ids from the ordinary vocabulary), an f16 KV cache for both, one warm-up per
engine, then --reps repetitions in which every measurement runs on each engine in turn (A B A B,
the order rotated each repetition) so that a busy phase of a shared machine hits all engines
alike; each figure is the fastest of its repetitions (the one least disturbed by other work on
a shared machine; every repetition is in the --json output). Also printed: the CPU's SIMD flags,
the machine's memory copy bandwidth, the weight bytes each engine reads per decode token
(app/bench/weightbytes.py), and how many cores other processes kept busy during the timed runs.
The runners and the interleaved schedule live in app/bench/schedule.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from app.bench import peer
from app.bench.load import BusyLoad, CpuMeter
from app.bench.schedule import (FULL, KV, LOAD, LOAD_QUICK, MODEL, QUICK, KvdeckRunner, Plan, best_of,
                                fastest, label, measure, progress)
from app.bench.weightbytes import gguf_weight_bytes, kvdeck_weight_bytes

FORMATS = ("nvfp4", "w4a8", "f16")
SEED = 1234
TOKEN_RANGE = (256, 49000)      # ordinary (non-special) ids of the SmolLM2 vocabulary
BUSY_MAX_S = 900.0              # lifetime of a busy process (killed earlier, at its level's end)


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


def load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


# ============================================================================
# The peer: setup
# ============================================================================
def open_peer(say, files: tuple[str, ...], settings, ids, threads: int, plan: Plan):
    """(runners, {file: {runner name: setting label}}, info) or (None, None, info) when absent.

    info: {"missing": why} when the peer cannot run, else version, system info and weight bytes.
    """
    lc = peer.load_llama_cpp()
    if lc is None:
        why = f"llama-cpp-python is not installed; to compare, {peer.INSTALL_HINT}"
        say(f"llama.cpp peer: {why}")
        return None, None, {"missing": why}
    src = peer.gguf_dir() / peer.GGUF_Q41
    if not src.exists():
        why = f"{src} missing (run `kvdeck models fetch {MODEL}`)"
        say(f"llama.cpp peer: {why}; peer skipped")
        return None, None, {"missing": why}
    paths = {"Q4_0": peer.ensure_q4_0(lc, src, peer.gguf_dir() / peer.GGUF_Q40, threads), "Q4_1": src}
    for q in files:
        why = peer.probe(paths[q], threads)
        if why:
            say(f"llama.cpp peer: {why}; peer skipped")
            return None, None, {"missing": why}
    runners, names = [], {}
    info = {"version": peer.version(lc), "system_info": peer.system_info(lc), "weight_bytes": {}}
    for q in files:
        names[q] = {}
        info["weight_bytes"][q] = gguf_weight_bytes(paths[q]).as_dict()
        for s in settings:
            name = f"llama.cpp {q} {s.label}"
            runners.append(peer.LlamaRunner(lc, paths[q], s, ids, threads, plan.n_ctx, plan.n_batch, name))
            names[q][name] = s.label
    return runners, names, info


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def bytes_line(name: str, wb: dict) -> str:
    """One line of the weight-bytes block; wb is a WeightBytes.as_dict()."""
    return (f"  {name:<16} {_mb(wb['total']):>9}  = head {_mb(wb['head'])} ({wb['head_kind']}) + layers "
            f"{_mb(wb['layers'])} ({wb['layers_kind']}) + one embedding row {wb['embed_row']} B")


# ============================================================================
# Table mode
# ============================================================================
def run_table(args, plan: Plan, ids, say, out: dict) -> None:
    files = ("Q4_0", "Q4_1") if args.q4_1 else ("Q4_0",)
    say("weights read per decode token:")
    ours, peers = [], None
    try:
        for fmt in args.formats:
            r = KvdeckRunner(fmt, ids, args.threads, plan.n_ctx)
            ours.append(r)
            wb = kvdeck_weight_bytes(r.engine.folder).as_dict()
            out["kvdeck"][fmt] = {"isa": r.isa, "weight_bytes": wb}
            say(bytes_line(r.name, wb))
        peers, names, info = (None, None, {"missing": "--no-peer"}) if args.no_peer else \
            open_peer(say, files, peer.SETTINGS, ids, args.threads, plan)
        out["llama_cpp"] = info
        for q in (files if peers else ()):
            say(bytes_line(f"llama.cpp {q}", info["weight_bytes"][q]))
        with CpuMeter() as meter:
            samples = measure(ours + (peers or []), plan, args.reps, args.budget_s)
        rates = fastest(samples)
        out["cpu_use"] = meter.result
        out["samples_tok_s"] = samples
        out["reps_done"] = min(len(v) for figs in samples.values() for v in figs.values())
    finally:
        for r in ours + (peers or []):
            r.close()

    figs = plan.figures()
    for r in ours:
        out["kvdeck"][r.fmt].update({f: rates[r.name][f] for f in figs})
    ref = None
    if peers:
        for q in files:
            info[q] = {"settings": {names[q][n]: rates[n] for n in names[q]},
                       "best": best_of(rates, names[q], figs)}
        ref = {f: info["Q4_0"]["best"][f]["tok_s"] for f in figs}
        for r in ours:
            out["kvdeck"][r.fmt]["ratio_to_llama_q4_0_best"] = {f: rates[r.name][f] / ref[f] for f in figs}

    w = 20
    say(f"\n{'tok/s':<34}" + "".join(f"{label(f):>{w}}" for f in figs))
    for r in ours:
        cells = [f"{rates[r.name][f]:.0f}" + (f" ({rates[r.name][f] / ref[f]:.2f}x)" if ref else "")
                 for f in figs]
        say(f"{r.name + ' [' + r.isa + ']':<34}" + "".join(f"{c:>{w}}" for c in cells))
    for q in (files if peers else ()):
        best = info[q]["best"]
        say(f"{'llama.cpp ' + q + ', best setting':<34}" + "".join(f"{best[f]['tok_s']:>{w}.0f}" for f in figs))
        say(f"{'  (setting that won)':<34}" + "".join(f"{best[f]['setting']:>{w}}" for f in figs))
        for label_, r in info[q]["settings"].items():
            say(f"{'  llama.cpp ' + q + ' ' + label_:<34}" + "".join(f"{r[f]:>{w}.0f}" for f in figs))
    if ref:
        say(f"(ratios: kvdeck / llama.cpp Q4_0 at its best setting per figure, same run, fastest of "
            f"{out['reps_done']} repetitions; llama.cpp "
            f"{info['version']}; fa = flash attention, ub = n_ubatch, n_batch = {plan.n_batch})")
    dec = f"decode_{min(plan.decode_ctx)}"
    bw = out["copy_bandwidth_gb_s"]
    parts = [f"{r.name} {out['kvdeck'][r.fmt]['weight_bytes']['total'] * rates[r.name][dec] / 1e9:.1f} GB/s"
             for r in ours]
    if ref:
        parts.append(f"llama.cpp Q4_0 {info['weight_bytes']['Q4_0']['total'] * ref[dec] / 1e9:.1f} GB/s")
    say(f"weight bytes read per second at {label(dec)}: " + ", ".join(parts) + f" (copy bandwidth {bw:.1f} GB/s)")
    say(noise_line(out["cpu_use"]))


def noise_line(use: dict) -> str:
    if use["others_cores"] is None:
        return "CPU use of other processes during the timed runs: unknown (no /proc/stat)"
    return (f"during the timed runs ({use['wall_s']:.0f} s) this bench kept {use['self_cores']:.2f} cores "
            f"busy and other processes {use['others_cores']:.2f} cores of {os.cpu_count()}")


# ============================================================================
# Load mode
# ============================================================================
def run_load(args, levels: list[int], plan: Plan, ids, say, out: dict) -> None:
    fig = plan.figures()[0]
    ours = KvdeckRunner(args.formats[0], ids, args.threads, plan.n_ctx)
    settings = [s for s in peer.SETTINGS if s.n_ubatch == 512]
    peers, names, info = (None, None, {"missing": "--no-peer"}) if args.no_peer else \
        open_peer(say, ("Q4_0",), settings, ids, args.threads, plan)
    out["llama_cpp"] = info
    rows = []
    try:
        for n in levels:
            before = load_avg()
            progress(f"load level {n} busy process(es)")
            with BusyLoad(n, BUSY_MAX_S) as busy, CpuMeter(busy) as meter:
                samples = measure([ours] + (peers or []), plan, args.reps, args.budget_s)
                rates = fastest(samples)
                if not busy.all_alive():
                    raise RuntimeError(f"a busy process ended before level {n}'s measurement did")
            row = {"busy": n, "load_avg_1min_before": before, "cpu_use": meter.result,
                   "kvdeck": rates[ours.name][fig],
                   "samples_tok_s": {name: v[fig] for name, v in samples.items()}}
            if peers:
                b = best_of(rates, names["Q4_0"], [fig])[fig]
                row.update(llama_cpp=b["tok_s"], llama_cpp_setting=b["setting"],
                           llama_cpp_settings={names["Q4_0"][k]: rates[k][fig] for k in names["Q4_0"]})
            rows.append(row)
    finally:
        for r in [ours] + (peers or []):
            r.close()
    idle = rows[0]
    for row in rows:
        row["kvdeck_ratio"] = row["kvdeck"] / idle["kvdeck"]
        if peers:
            row["llama_cpp_ratio"] = row["llama_cpp"] / idle["llama_cpp"]
    out["load"] = {"figure": fig, "format": ours.fmt, "rows": rows}

    say(f"\n{label(fig)} ({plan.decode_tokens} tokens), tok/s and ratio to the same engine idle; "
        f"N busy-looping processes beside it on {os.cpu_count()} cores, {args.threads} threads each engine")
    say(f"{'busy':>4}  {'kvdeck ' + ours.fmt:>20}  {'llama.cpp Q4_0 (best of fa off/on)':>36}  "
        f"{'busy loops used':>15}  {'others used':>11}")
    for row in rows:
        peer_cell = (f"{row['llama_cpp']:.0f} ({row['llama_cpp_ratio']:.2f}x) [{row['llama_cpp_setting']}]"
                     if peers else "-")
        use = row["cpu_use"]
        kids, others = ((f"{use['busy_children_cores']:.2f} cores", f"{use['others_cores']:.2f} cores")
                        if use["others_cores"] is not None else ("?", "?"))
        say(f"{row['busy']:>4}  {row['kvdeck']:>11.0f} ({row['kvdeck_ratio']:.2f}x)  {peer_cell:>36}  "
            f"{kids:>15}  {others:>11}")
    say("(busy loops used / others used: average cores kept busy during the level's timed runs by the "
        "busy processes / by processes other than this bench)")


# ============================================================================
# Command
# ============================================================================
def _levels(text: str) -> list[int]:
    try:
        got = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--load {text!r}: give busy-process counts such as 2 or 0,1,2") from None
    if not got or min(got) < 0:
        raise SystemExit(f"--load {text!r}: counts must be >= 0")
    return sorted(set([0] + got))


def _contexts(text: str) -> tuple[int, ...]:
    try:
        got = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--decode-ctx {text!r}: give token counts such as 32,2048,8192") from None
    if not got or got[0] < 1:
        raise SystemExit(f"--decode-ctx {text!r}: contexts must be >= 1 token")
    return tuple(got)


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvdeck bench cpu", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--save", metavar="FILE", help="also write the JSON object to FILE")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both engines")
    ap.add_argument("--reps", type=int, help="timed repetitions per figure, the fastest reported "
                    "(default 2; 3 with --load)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="kvdeck formats to run (load mode: the first)")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--q4-1", action="store_true", help="also run llama.cpp on the shipped Q4_1 file")
    ap.add_argument("--load", metavar="N[,N...]", help="load mode: decode with N busy processes beside")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="start no repetition after the first once this many seconds are spent "
                         "(per --load level; default 300)")
    ap.add_argument("--decode-ctx", metavar="N[,N...]",
                    help="contexts of the decode figures (table mode; default 32,2048; e.g. 32,2048,8192: "
                         "each context's prefill is timed too, minutes at 8192)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, nvfp4 only, 1 repetition")
    args = ap.parse_args(argv)
    args.formats = ["nvfp4"] if args.quick else args.formats.split(",")
    if args.quick:
        args.reps = 1
    elif args.reps is None:
        args.reps = 3 if args.load is not None else 2
    if args.reps < 1 or args.threads < 1:
        ap.error("--reps and --threads must be >= 1")
    levels = _levels(args.load) if args.load is not None else None
    plan = (LOAD_QUICK if args.quick else LOAD) if levels else (QUICK if args.quick else FULL)
    if args.decode_ctx is not None:
        if levels:
            ap.error("--decode-ctx is for table mode (not with --load)")
        plan = dataclasses.replace(plan, decode_ctx=_contexts(args.decode_ctx))
    say = (lambda *a: None) if args.json else print

    t_start = time.monotonic()
    ids = np.random.default_rng(SEED).integers(*TOKEN_RANGE, size=plan.n_ctx, dtype=np.int32)
    from app.bench.kernels import copy_bandwidth

    facts, la = cpu_facts(), load_avg()
    out = {"model": MODEL, "threads": args.threads, "kv": KV, "reps": args.reps, "cpu": facts,
           "load_avg_1min_before": la, "copy_bandwidth_gb_s": copy_bandwidth() / 1e9,
           "plan": {"prefill": plan.prefill, "decode_ctx": plan.decode_ctx,
                    "decode_tokens": plan.decode_tokens, "figures": plan.figures()},
           "kvdeck": {}, "llama_cpp": None}
    say(f"kvdeck bench cpu — {MODEL}, {args.threads} threads (both engines), fastest of {args.reps} "
        f"interleaved repetitions after a warm-up; same token ids (seed {SEED}); KV cache f16 (both)")
    la_text = f"{la:.2f}" if la is not None else "unknown"
    say(f"CPU: {facts['model']}, {facts['cores']} cores; flags: {' '.join(facts['flags'])}; "
        f"1-min load average {la_text} before the run")
    say(f"memory copy bandwidth: {out['copy_bandwidth_gb_s']:.1f} GB/s (numpy copy of 256 MiB, "
        f"read + write bytes, best of 5)")
    if levels:
        run_load(args, levels, plan, ids, say, out)
    else:
        run_table(args, plan, ids, say, out)
    out["elapsed_s"] = time.monotonic() - t_start
    say(f"the run took {out['elapsed_s']:.0f} s")
    after = out["load_avg_1min_after"] = load_avg()
    if after is not None and la is not None:
        others = [u["others_cores"] for u in [out.get("cpu_use")] + [r["cpu_use"] for r in
                  out.get("load", {}).get("rows", [])] if u and u["others_cores"] is not None]
        # the measured CPU use of other processes when known, else the load average
        busy = max(others) > 0.25 if others else max(la, after) > 0.75 * facts["cores"]
        say(f"1-min load average {la:.2f} before, {after:.2f} after, on {facts['cores']} cores"
            + ("; the machine was busy with other work: these figures are its noise as much as the "
               "engines' speed" if busy else ""))
    if args.save:
        Path(args.save).write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
