"""`kvdeck bench formats [--json] [--root DIR] [--formats a,label=DIR,..] [--reps R] [--quick] [--peer]`:
the weight formats of the default model side by side: folder MB, decode tok/s, and top-1
agreement and perplexity against the f32 engine on the evaluation texts.

  * a format may name its activations: `gguf@a8` is the gguf folder with 8-bit activations
    (default: the engine's "auto", a16 for gguf, a8 otherwise).
  * folder MB: the files of <root>/<format>/ (config, safetensors, tokenizer), 10^6 bytes.
  * decode tok/s: 64 one-token calls after a 32-token context (fixed-seed ids, KV f16, all
    cores unless --threads), the formats interleaved (A B C, A B C, ...), best of --reps.
  * top-1 / perplexity: a cold forward of each text in assets/eval/ (KV f32), greedy
    agreement with the f32 folder of --ref-root (default: --root) and perplexity of the
    text, per text and pooled over all tokens; "ppl ×" is the ratio to f32's.
  * --peer: llama.cpp (llama-cpp-python) on the source GGUF in models/weights/_downloads/,
    the same texts (accuracy only: `kvdeck bench cpu` measures its speed).
The load average is printed with the figures; above ~2.5 the speed column is not comparable
with a quiet machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

EVAL = Path(__file__).resolve().parents[2] / "assets" / "eval"
DEFAULT_FORMATS = ("f32", "f16", "gguf", "nvfp4", "w4a8")
TEXTS = ("edge_agents", "field_notes")


def nll(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    L = logits.astype(np.float64)
    m = L.max(-1, keepdims=True)
    lse = np.log(np.exp(L - m).sum(-1)) + m[:, 0]
    return lse[:-1] - L[np.arange(len(ids) - 1), ids[1:]]


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 1e6


def accuracy(logits: dict[str, np.ndarray], ref: dict[str, np.ndarray], texts: dict[str, list[int]]) -> dict:
    """Per text and pooled: top-1 agreement with ref, perplexity and its ratio to ref's."""
    out, agree, n_all, nl_all, nl_ref = {}, 0, 0, [], []
    for name, ids in texts.items():
        L, R = logits[name], ref[name]
        a = L.argmax(-1) == R.argmax(-1)
        nl, nr = nll(L, ids), nll(R, ids)
        out[name] = {"top1": float(a.mean()), "ppl": float(np.exp(nl.mean())),
                     "ppl_ratio": float(np.exp(nl.mean() - nr.mean()))}
        agree, n_all = agree + int(a.sum()), n_all + a.size
        nl_all.append(nl), nl_ref.append(nr)
    nl, nr = np.concatenate(nl_all), np.concatenate(nl_ref)
    out["all"] = {"top1": agree / n_all, "ppl": float(np.exp(nl.mean())), "ppl_ratio": float(np.exp(nl.mean() - nr.mean()))}
    return out


def decode_rates(engines: dict, reps: int, ctx: int = 32, n: int = 64) -> dict[str, list[float]]:
    ids = np.random.default_rng(1234).integers(256, 49000, ctx + n).astype(np.int32)
    rates: dict[str, list[float]] = {k: [] for k in engines}
    for r in range(reps + 1):  # repetition 0 is the warm-up
        names = list(engines)
        names = names[r % len(names):] + names[: r % len(names)]
        for k in names:
            nat = engines[k].native
            seq = nat.open_sequence()
            try:
                nat.forward(seq, ids[:ctx], False)
                t0 = time.perf_counter()
                for i in range(ctx, ctx + n):
                    nat.forward(seq, ids[i:i + 1], False)
                dt = time.perf_counter() - t0
            finally:
                nat.close_sequence(seq)
            if r:
                rates[k].append(n / dt)
    return rates


def peer_logits(texts: dict[str, list[int]], threads: int) -> tuple[str, dict[str, np.ndarray]] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    root = Path(__file__).resolve().parents[2] / "models" / "weights" / "_downloads"
    files = sorted(root.glob("SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not files:
        return None
    n_ctx = max(len(v) for v in texts.values()) + 8
    llm = Llama(model_path=str(files[0]), logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                n_threads=threads, verbose=False)
    out = {}
    for k, ids in texts.items():
        llm.reset()
        llm.eval(ids)
        out[k] = np.array(llm.scores[: len(ids)], dtype=np.float32)
    return f"llama.cpp {files[0].stem.split('.')[-1]}", out


def run(argv: list[str]) -> int:
    from app.engine import load_engine

    ap = argparse.ArgumentParser(prog="kvdeck bench formats", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=None, help="model root holding <format>/ folders (default: the default model's)")
    ap.add_argument("--ref-root", default=None, help="where the f32 reference folder is (default: --root)")
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="edge_agents.txt only, 2 repetitions")
    ap.add_argument("--peer", action="store_true", help="add llama.cpp's accuracy on the source GGUF")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from app.bench.schedule import MODEL
    from models.fetch import WEIGHTS_DIR

    root = Path(a.root) if a.root else WEIGHTS_DIR / MODEL
    ref_root = Path(a.ref_root) if a.ref_root else root
    folders, acts = {}, {}  # label -> folder: "nvfp4" is <root>/nvfp4, "label=PATH" a folder anywhere
    for item in (f.strip() for f in a.formats.split(",")):
        if item:
            label, _, path = item.partition("=")
            name, _, act = label.partition("@")  # "gguf@a8": activations a8
            folders[label] = Path(path) if path else root / name
            acts[label] = act or "auto"
    fmts = list(folders)
    reps = 2 if a.quick else a.reps
    names = TEXTS[:1] if a.quick else TEXTS
    ref_engine = load_engine(ref_root, weights="f32", kv="f32")
    texts = {n: ref_engine.tokenizer.encode((EVAL / f"{n}.txt").read_text(), add_special_tokens=False).ids for n in names}
    ref = {n: ref_engine.logits(ids) for n, ids in texts.items()}
    del ref_engine
    rows: dict[str, dict] = {}
    engines = {}
    for f in fmts:
        e = load_engine(folders[f], kv="f32", threads=a.threads or None, activations=acts[f])
        rows[f] = {"folder_mb": folder_mb(folders[f]), "recipe": _recipe(folders[f]), "activations": e.native.activations,
                   "accuracy": accuracy({n: e.logits(ids) for n, ids in texts.items()}, ref, texts)}
        del e
        engines[f] = load_engine(folders[f], kv="f16", threads=a.threads or None, max_context=256,
                                 activations=acts[f])
    load0 = os.getloadavg()[0]
    rates = decode_rates(engines, reps)
    load1 = os.getloadavg()[0]
    for f in fmts:
        rows[f]["decode_tok_s"] = max(rates[f])
        rows[f]["decode_samples"] = rates[f]
    peer = peer_logits(texts, a.threads or os.cpu_count() or 1) if a.peer else None
    if peer:
        rows[peer[0]] = {"folder_mb": None, "decode_tok_s": None, "accuracy": accuracy(peer[1], ref, texts)}
    out = {"root": str(root), "texts": {n: len(ids) for n, ids in texts.items()}, "load_avg": [load0, load1],
           "reps": reps, "formats": rows}
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    tok = ", ".join(f"{n}.txt {len(ids)}" for n, ids in texts.items())
    print(f"\nweights of {root} (tokens: {tok}; top-1 and perplexity vs the f32 engine, KV f32; "
          f"decode@32 KV f16, best of {reps}; load average {load0:.1f} -> {load1:.1f})\n")
    print("| weights | folder MB | decode tok/s | top-1 | perplexity (× f32) |")
    print("|---|---|---|---|---|")
    for f, r in rows.items():
        acc = r["accuracy"]["all"]
        mb = "-" if r["folder_mb"] is None else f"{r['folder_mb']:.1f}"
        sp = "-" if r["decode_tok_s"] is None else f"{r['decode_tok_s']:.1f}"
        print(f"| {f} | {mb} | {sp} | {acc['top1']:.3f} | {acc['ppl']:.2f} ({acc['ppl_ratio']:.3f}×) |")
    return 0


def _recipe(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text()).get("weights", {}).get("recipe", {})
    except (OSError, ValueError):
        return {}
