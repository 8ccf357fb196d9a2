"""Which activation rounding lets the exact GGUF import (weights format "gguf") match f32?

`python -m models.quant.act_study [--folder DIR] SCHEME[:PARTS] ...` runs the f32 folder's
weights (the GGUF file's blocks dequantised, so the weights are exact) in the float32 torch
forward (reference_forward.py) with every linear's input rounded as SCHEME, and prints top-1
agreement and the perplexity ratio against the unrounded forward over assets/eval/*.txt.

SCHEME: a8 (the engine's int8 per 32 values), a8/16 (int8 per 16), a10, a12, a16 (signed
integers of that width per 32 values), 2x8 (two int8 planes: x ~ s1*q1 + s2*q2, q2 the
rounded residual). PARTS (optional, "+"-separated substrings of HF linear names, e.g.
`a16:down_proj+lm_head`): only those linears get SCHEME, the rest a8.

Measured 2026-12-01 (SmolLM2-135M, 2120 tokens): a8 0.9557 / 1.0067, a8/16 0.9693 / 1.0039,
a10 0.9925 / 0.9998, a12 0.9976 / 1.0002, a16 0.9995 / 1.0000, 2x8 0.9995 / 1.0000; a16 on the
head only 0.9736, on the layers only 0.9783, q/k/v/o + head 0.9783, gate/up + head 0.9745.
So every matmul needs the wider activations; the engine implements a16 (gemm_a16*.cpp).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from models.quant.reference_forward import TorchLlama

ROOT = Path(__file__).resolve().parents[2]
QMAX = {"a8": 127, "a10": 511, "a12": 2047, "a16": 32767}


def round_blocks(x: torch.Tensor, block: int, qmax: int) -> torch.Tensor:
    """Symmetric per-block rounding of x [M, K] (K % block == 0) as the engine's quantiser."""
    M, K = x.shape
    xb = x.reshape(M, K // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    return (torch.clamp(torch.round(xb / s), -qmax, qmax) * s).reshape(M, K)


def apply(scheme: str, x: torch.Tensor) -> torch.Tensor:
    if scheme == "a8/16":
        return round_blocks(x, 16, 127)
    if scheme == "2x8":
        y1 = round_blocks(x, 32, 127)
        return y1 + round_blocks(x - y1, 32, 127)
    if scheme in QMAX:
        return round_blocks(x, 32, QMAX[scheme])
    raise SystemExit(f"unknown scheme {scheme!r} (a8, a8/16, a10, a12, a16, 2x8)")


def hook(spec: str):
    scheme, _, parts = spec.partition(":")
    names = parts.split("+") if parts else None

    def lin(name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        hit = names is None or any(p in name for p in names)
        return apply(scheme if hit else "a8", x) @ w.T

    return lin


def nll(L: np.ndarray, ids: list[int]) -> np.ndarray:
    L = L.astype(np.float64)
    m = L.max(-1, keepdims=True)
    return (np.log(np.exp(L - m).sum(-1)) + m[:, 0])[:-1] - L[np.arange(len(ids) - 1), ids[1:]]


def main(argv: list[str] | None = None) -> int:
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("schemes", nargs="+")
    ap.add_argument("--folder", default=str(ROOT / "models" / "weights" / "smollm2-135m" / "f32"))
    a = ap.parse_args(argv)
    folder = Path(a.folder)
    model = TorchLlama(json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors")))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = [tok.encode(f.read_text(), add_special_tokens=False).ids for f in sorted((ROOT / "assets" / "eval").glob("*.txt"))]
    ref = [model.logits(ids) for ids in texts]
    print(f"| scheme | top-1 vs f32 | ppl × | ({sum(map(len, texts))} tokens)")
    for spec in a.schemes:
        t0, agree, n, nl, nr = time.time(), 0, 0, [], []
        for ids, R in zip(texts, ref):
            L = model.logits(ids, hook(spec))
            agree, n = agree + int((L.argmax(-1) == R.argmax(-1)).sum()), n + len(ids)
            nl.append(nll(L, ids)), nr.append(nll(R, ids))
        ratio = float(np.exp(np.concatenate(nl).mean() - np.concatenate(nr).mean()))
        print(f"| {spec} | {agree / n:.4f} | {ratio:.4f} | {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
