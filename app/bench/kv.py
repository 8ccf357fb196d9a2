"""`kvdeck bench kv`: KV formats' bytes per token and fidelity against f16 KV at 2K and 8K.

For each KV format (the reference, f16, first): the pool's bytes per token and its ratio to
f16's; over the eval texts (assets/eval, both texts: 2,121 tokens; longer contexts repeat
them, so 8K is ~3.9 copies and its later copies can be read back from far context), the
top-1 agreement of every position's next-token logits with the f16 KV engine's and the
perplexity ratio; and decode tok/s at the first context (a greedy step after the context,
median of --steps). Positions are fed in 512-token calls on one sequence (the engine's own
prefill chunk), so no [T, vocab] logits array is ever held.

Every position reads its context from the pages (KVDECK_KV_FRESH=0), as a generated token does:
the engine's prefill lets a chunk read its own K/V unrounded (attention_fresh), which would
score 512-token chunks better than any reply sees them. `--fresh` measures that prefill path.
kpc4 has one rule for both: a query reads its own 16-token page unrounded (the pool holds the
open page in f32 until it fills), every earlier page from the pool.

`--speed`: instead, prefill and decode speed at the first context, the formats' engines loaded
together and timed in turn (the order alternating), best of --reps: prefill tok/s of the
whole context (one call, last logits only) and decode tok/s (median of --steps steps after it).

    kvdeck bench kv [--formats f16,kpc4,nvfp4,nvfp4r,k8v4] [--ctx 2048,8192] [--weights f32] [--json]
    kvdeck bench kv --speed [--formats nvfp4,kpc4] [--ctx 2048] [--reps 3] [--weights nvfp4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

EVAL = Path(__file__).resolve().parents[2] / "assets" / "eval"
CHUNK = 512


def eval_ids(tokenizer, ctx: int) -> list[int]:
    """Both eval texts; repeated (joined by a blank line) until ctx tokens when ctx is longer."""
    text = (EVAL / "edge_agents.txt").read_text() + "\n\n" + (EVAL / "field_notes.txt").read_text()
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    sep = tokenizer.encode("\n\n", add_special_tokens=False).ids
    out = list(ids)
    while len(out) < ctx:
        out += sep + ids
    return out[:ctx]


def score_pass(eng, ids: list[int], decode_steps: int = 0):
    """(argmax [T], nll of the next token [T-1] float64, decode step seconds [decode_steps])."""
    seq = eng.native.open_sequence()
    try:
        arg, nll = [], []
        for c0 in range(0, len(ids), CHUNK):
            chunk = ids[c0 : c0 + CHUNK]
            L = eng._forward(seq, chunk, all_logits=True).astype(np.float64)
            arg.append(L.argmax(-1))
            nxt = ids[c0 + 1 : c0 + len(chunk) + 1]
            m = L.max(-1)
            lse = np.log(np.exp(L - m[:, None]).sum(-1)) + m
            nll.append(lse[: len(nxt)] - L[np.arange(len(nxt)), nxt])
        steps, tok = [], int(arg[-1][-1])
        for _ in range(decode_steps):
            t = time.perf_counter()
            tok = int(eng._forward(seq, [tok]).argmax())
            steps.append(time.perf_counter() - t)
        return np.concatenate(arg), np.concatenate(nll), steps
    finally:
        eng.native.close_sequence(seq)


def measure(root, formats, ctxs, weights, decode_steps, log=print) -> list[dict]:
    from app.engine import load_engine

    rows, ref = [], {}
    for fmt in formats:
        eng = load_engine(root, weights=weights, kv=fmt, max_context=max(ctxs) + decode_steps + 16)
        bpt = eng.snapshot()["bytes_per_token"]
        row = {"kv": fmt, "bytes_per_token": bpt}
        for ctx in ctxs:
            ids = eval_ids(eng.tokenizer, ctx)
            t = time.perf_counter()
            arg, nll, steps = score_pass(eng, ids, decode_steps if ctx == ctxs[0] else 0)
            if fmt == formats[0]:
                ref[ctx] = (arg, nll)
            ra, rn = ref[ctx]
            row[f"top1_{ctx}"] = float((arg == ra).mean())
            row[f"ppl_ratio_{ctx}"] = float(np.exp(nll.mean() - rn.mean()))
            row[f"ppl_{ctx}"] = float(np.exp(nll.mean()))
            if steps:
                row[f"decode_tok_s_{ctx}"] = 1.0 / statistics.median(steps)
            log(f"  {fmt} ctx {len(ids)}: {time.perf_counter() - t:.0f} s  load {os.getloadavg()[0]:.2f}")
        rows.append(row)
        del eng
    f16 = next((r["bytes_per_token"] for r in rows if r["kv"] == "f16"), None)
    for r in rows:
        r["x_f16_bytes"] = r["bytes_per_token"] / f16 if f16 else None
    return rows


def speed(root, formats, ctx, weights, steps, reps, log=print) -> list[dict]:
    from app.engine import load_engine

    engines = {f: load_engine(root, weights=weights, kv=f, max_context=ctx + steps + 16) for f in formats}
    ids = eval_ids(next(iter(engines.values())).tokenizer, ctx)
    best = {f: [float("inf"), float("inf")] for f in formats}  # prefill s, decode s per step
    for r in range(reps):
        for f in (formats if r % 2 == 0 else formats[::-1]):
            eng = engines[f]
            seq = eng.native.open_sequence()
            try:
                t = time.perf_counter()
                tok = int(eng._forward(seq, ids).argmax())
                pre = time.perf_counter() - t
                dt = []
                for _ in range(steps):
                    t = time.perf_counter()
                    tok = int(eng._forward(seq, [tok]).argmax())
                    dt.append(time.perf_counter() - t)
            finally:
                eng.native.close_sequence(seq)
            best[f] = [min(best[f][0], pre), min(best[f][1], statistics.median(dt))]
            log(f"  rep {r} {f}: prefill {ctx / pre:.0f} tok/s, decode {1 / statistics.median(dt):.1f} tok/s"
                f"  load {os.getloadavg()[0]:.2f}")
    return [{"kv": f, "ctx": ctx, "prefill_tok_s": ctx / best[f][0], "decode_tok_s": 1.0 / best[f][1]} for f in formats]


def table(rows, ctxs, ref) -> str:
    head = f"{'KV':7s} {'B/token':>8s} {'×f16':>6s}"
    for c in ctxs:
        head += f" {'top1@' + str(c):>10s} {'ppl×@' + str(c):>10s}"
    head += f" {'decode tok/s@' + str(ctxs[0]):>17s}"
    out = [f"(top-1 and perplexity against {ref} KV)", head]
    for r in rows:
        x = r["x_f16_bytes"]
        line = f"{r['kv']:7s} {r['bytes_per_token']:8d} {x:6.3f}" if x else f"{r['kv']:7s} {r['bytes_per_token']:8d} {'-':>6s}"
        for c in ctxs:
            line += f" {r[f'top1_{c}']:10.3f} {r[f'ppl_ratio_{c}']:10.4f}"
        line += f" {r.get(f'decode_tok_s_{ctxs[0]}', float('nan')):17.1f}"
        out.append(line)
    return "\n".join(out)


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="kvdeck bench kv", description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="f16,kpc4,nvfp4,nvfp4r,k8v4", help="KV formats; the first is the reference")
    ap.add_argument("--ctx", default="2048,8192", help="context lengths (tokens); decode is timed at the first")
    ap.add_argument("--weights", default="f32")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed (median)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--speed", action="store_true", help="prefill / decode speed at the first context instead")
    ap.add_argument("--reps", type=int, default=3, help="--speed: repetitions per format (best of)")
    ap.add_argument("--fresh", action="store_true",
                    help="let each 512-token chunk read its own K/V unrounded (the engine's prefill path)")
    a = ap.parse_args(argv)
    os.environ["KVDECK_KV_FRESH"] = "1" if a.fresh else "0"  # read at every forward call
    from app.engine import EngineError, default_models_dir
    from app.engine.loader import KV_FORMATS

    formats, ctxs = a.formats.split(","), [int(c) for c in a.ctx.split(",")]
    bad = [f for f in formats if f not in KV_FORMATS]
    if bad:
        sys.stderr.write(f"unknown KV format(s) {bad} (known: {', '.join(KV_FORMATS)})\n")
        return 2
    log = (lambda s: sys.stderr.write(s + "\n")) if a.json else print
    log(f"load before: {os.getloadavg()}")
    if a.speed:
        try:
            rows = speed(default_models_dir() / a.model, formats, ctxs[0], a.weights, a.steps, a.reps, log)
        except EngineError as e:
            sys.stderr.write(f"bench kv: {e}\n")
            return 1
        load = os.getloadavg()
        if a.json:
            print(json.dumps({"weights": a.weights, "load": load, "speed": rows}))
        else:
            print(f"weights {a.weights}; best of {a.reps}; load after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
            for r in rows:
                print(f"{r['kv']:7s} prefill {r['ctx']} tok: {r['prefill_tok_s']:8.1f} tok/s   decode: "
                      f"{r['decode_tok_s']:6.1f} tok/s   (x{r['prefill_tok_s'] / rows[0]['prefill_tok_s']:.2f} / "
                      f"x{r['decode_tok_s'] / rows[0]['decode_tok_s']:.2f} of {rows[0]['kv']})")
        return 0
    try:
        rows = measure(default_models_dir() / a.model, formats, ctxs, a.weights, a.steps, log)
    except EngineError as e:
        sys.stderr.write(f"bench kv: {e}\n")
        return 1
    load = os.getloadavg()
    if a.json:
        print(json.dumps({"weights": a.weights, "ref": formats[0], "ctx": ctxs, "load": load, "fresh": a.fresh,
                          "rows": rows}))
    else:
        print(f"weights {a.weights}; {'chunks read their own K/V unrounded' if a.fresh else 'every read from the pages'}"
              f"; load after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(table(rows, ctxs, formats[0]))
    return 0
