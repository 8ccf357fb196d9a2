"""A torch model of the default model's forward with pluggable K/V rounding (KV error study).

Not the engine: a float32 torch re-implementation of the llama forward (RMSNorm, rotate-half
RoPE, GQA, SiLU MLP, tied head) over the f32 folder's safetensors, in which every layer's
post-RoPE K and V pass through a chosen KV codec before attention reads them. It answers
"where does the KV error come from" cheaply (one forward per variant; per-layer statistics
from the reference run) and lets codec variants be compared before one is written in C++.
The codecs are in app/bench/kv_probe_codecs.py.

    python -m app.bench.kv_probe [--ctx 2048] [--variants nvfp4,int8/nvfp4,...] [--stats]
                                 [--own | --own-page]

--own: a 512-token chunk's queries read the chunk's own K/V unrounded (the engine's
attention_fresh); --own-page: a query reads its own 16-token page unrounded (a pool that keeps
the page being filled unrounded and rounds it once full, as "pcf" / "pce" need).

Variant names: one codec for K and V, or "<K codec>/<V codec>"; codecs f16, nvfp4 (scale 1),
nvfp4r (f16 row scale), nvfp4m (mse block scales), nvfp4b8 (blocks of 8), fp8, int8, pcf / pce
/ pcz (per channel over a 16-token page: asymmetric int4 with an f16 / E4M3 minimum and step,
or a 16-step window at an int8 offset z on an E4M3 step d);
suffix "+h": Hadamard-rotated before rounding; prefix "c:": minus a per-(layer, head) mean
calibrated on assets/notes; prefix "s:": the first 16 tokens kept in f16; prefix
"sm<a>_<av>[@level]:": K / s and V / t with the per-channel smoothing factors of
models/quant/kv_smooth.py (alpha a for K's pairs, av for V) calibrated on assets/calib/mixed.txt
(the same math as folding them into the weights: q·k = (q s)·(k / s)); prefix "cr:": minus
R_n mu, the pre-RoPE mean mu per (layer, head) calibrated on assets/calib/mixed.txt rotated to
the row's position n, added back on reading (K pre-RoPE is mostly that mean).

Measured (2,048 eval tokens, f32 weights, top-1 / perplexity ratio against f16 KV; K codec /
V codec; bytes per token relative to f16's): every read from the pages: nvfp4 0.833 (0.281x),
pre-RoPE-mean K "cr:nvfp4/f16" 0.851 (nvfp4 K with f16 V: 0.826), smoothing "sm..." 0.789 -
0.835 (models/quant/kv_smooth.py), pcf/nvfp4 0.929 (0.328x), pce/nvfp4 0.927 (0.297x);
--own-page: nvfp4 0.878, pcf/nvfp4 0.958 / 1.0095, pce/nvfp4 0.948 / 1.0039, pcz/nvfp4 0.933;
--own: nvfp4 0.951 / 1.0085 (a 512-token chunk scored with its own K/V unrounded). 8,192
tokens, --own-page: nvfp4 0.935 / 1.137, pce/nvfp4 0.980 / 1.015.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from app.bench import kv_probe_codecs as C
from app.bench.kv import eval_ids
from app.bench.kv_probe_codecs import CALIB, CENTER, PREMEAN, SMOOTH, codec, e4m3

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "assets" / "eval"

# =====================================================================================
# The model
# =====================================================================================

class Model:
    def __init__(self, folder: Path):
        from safetensors.torch import load_file

        self.cfg = json.loads((folder / "config.json").read_text())
        self.w = load_file(str(folder / "model.safetensors"))
        c = self.cfg
        self.L, self.nh, self.nkv, self.D = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        half = self.D // 2
        self.inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, half, dtype=torch.float32) * 2 / self.D))
        self.eps = c["rms_norm_eps"]

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, pos):  # x [T, h, D]
        a = pos.float()[:, None] * self.inv_freq[None]
        cs, sn = torch.cos(a)[:, None], torch.sin(a)[:, None]
        h = self.D // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cs - x2 * sn, x2 * cs + x1 * sn], -1)

    @torch.no_grad()
    def forward(self, ids, kv_fn=None, chunk=512, own_unquantised=False, capture=None, own_page=False):
        """Logits [T, V]. kv_fn rounds each layer's K/V (None: exact f32). own_unquantised:
        queries of a chunk see their own chunk's K/V unrounded (attn's Backend hook)."""
        T = len(ids)
        pos = torch.arange(T)
        x = self.w["model.embed_tokens.weight"][torch.tensor(ids)]
        G = self.nh // self.nkv
        for l in range(self.L):
            p = f"model.layers.{l}."
            h = self.norm(x, self.w[p + "input_layernorm.weight"])
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).view(T, self.nh, self.D)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).view(T, self.nkv, self.D)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).view(T, self.nkv, self.D)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if capture is not None:
                capture.append((q.clone(), k.clone(), v.clone()))
            kq, vq = (k, v) if kv_fn is None else (kv_fn(k, l, "k"), kv_fn(v, l, "v"))
            o = torch.empty(T, self.nh, self.D)
            for c0 in range(0, T, chunk):
                c1 = min(T, c0 + chunk)
                if own_unquantised:
                    kk = torch.cat([kq[:c0], k[c0:c1]]); vv = torch.cat([vq[:c0], v[c0:c1]])
                else:
                    kk, vv = kq[:c1], vq[:c1]
                o[c0:c1] = attend(q[c0:c1], kk, vv, c0, G, (k[:c1], v[:c1]) if own_page else None)
            x = x + o.view(T, -1) @ self.w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"])
            a = h @ self.w[p + "mlp.gate_proj.weight"].T
            b = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(a) * b) @ self.w[p + "mlp.down_proj.weight"].T
        x = self.norm(x, self.w["model.norm.weight"])
        return x @ self.w["model.embed_tokens.weight"].T


def attend(q, k, v, p0, G, exact=None):
    """Causal attention of queries at p0.. over keys 0..p0+len(q). q [M, nh, D], k/v [n, nkv, D].
    exact: the unrounded (k, v): a query reads the keys of its own 16-token page from them (a
    pool that holds the page being filled unrounded)."""
    M, n, D = q.shape[0], k.shape[0], q.shape[2]
    kh = k.repeat_interleave(G, 1).permute(1, 2, 0)  # [nh, D, n]
    vh = v.repeat_interleave(G, 1).permute(1, 0, 2)  # [nh, n, D]
    s = torch.bmm(q.permute(1, 0, 2), kh) / math.sqrt(D)  # [nh, M, n]
    if exact is not None:
        own = ((p0 + torch.arange(M))[:, None] // 16) == (torch.arange(n)[None, :] // 16)  # [M, n]
        se = torch.bmm(q.permute(1, 0, 2), exact[0].repeat_interleave(G, 1).permute(1, 2, 0)) / math.sqrt(D)
        s = torch.where(own, se, s)
        p = torch.softmax(s.masked_fill(torch.arange(n)[None, :] > (p0 + torch.arange(M))[:, None], float("-inf")), -1)
        ve = exact[1].repeat_interleave(G, 1).permute(1, 0, 2)
        return (torch.bmm(p * ~own, vh) + torch.bmm(p * own, ve)).permute(1, 0, 2)
    mask = torch.arange(n)[None, :] > (p0 + torch.arange(M))[:, None]
    s.masked_fill_(mask, float("-inf"))
    return torch.bmm(torch.softmax(s, -1), vh).permute(1, 0, 2)


# =====================================================================================
# Texts and scores
# =====================================================================================

def score(ref: torch.Tensor, q: torch.Tensor, ids) -> tuple[float, float]:
    def nll(L):
        L = L.double()
        return (torch.logsumexp(L[:-1], -1) - L[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]).mean()
    top1 = (ref.argmax(-1) == q.argmax(-1)).float().mean().item()
    return top1, math.exp(nll(q) - nll(ref))


def stats(model: Model, ids) -> None:
    """Per layer and KV head: K/V magnitudes, share of NVFP4 blocks whose E4M3 scale is
    subnormal / zero, and the relative error of the attention output when only K or only V
    of that layer is rounded (everything else exact)."""
    cap: list = []
    model.forward(ids, None, capture=cap)
    G = model.nh // model.nkv
    print("layer  |k|max  |v|max  k:sub%  v:sub%  v:zero%   attn err: K-only  V-only  (nvfp4, scale 1)  K/V rowscale")
    for l, (q, k, v) in enumerate(cap):
        T = len(ids)
        sl = slice(max(0, T - 256), T)  # the last 256 queries see the whole context
        ref = attend(q[sl], k, v, sl.start, G)

        def err(kk, vv):
            o = attend(q[sl], kk, vv, sl.start, G)
            return ((o - ref).norm() / ref.norm()).item()

        def sub(x):
            s = x.reshape(-1, 16).abs().amax(-1) / 6.0
            return 100 * (s < 2**-6).float().mean().item(), 100 * (e4m3(s) == 0).float().mean().item()
        ks, _ = sub(k); vs, vz = sub(v)
        nv = codec("nvfp4")
        nr = codec("nvfp4r")
        print(f"{l:5d} {k.abs().max():7.2f} {v.abs().max():7.3f} {ks:7.1f} {vs:7.1f} {vz:7.1f}"
              f"   {err(nv(k, l, 'k'), v):15.4f} {err(k, nv(v, l, 'v')):7.4f}"
              f"   {err(nr(k, l, 'k'), v):10.4f} {err(k, nr(v, l, 'v')):7.4f}")
        per_head_v = [f"{v[:, g].abs().amax(-1).median():.3f}" for g in range(model.nkv)]
        per_head_k = [f"{k[:, g].abs().amax(-1).median():.2f}" for g in range(model.nkv)]
        print(f"       median row max per head: k {per_head_k} v {per_head_v}")


def calibrate(model: Model, ids) -> None:
    """Per (layer, head): g = max over the calibration tokens of |x| / (6 * 448)."""
    cap: list = []
    model.forward(ids, None, capture=cap)
    for l, (_, k, v) in enumerate(cap):
        CALIB[(l, "k")] = k.abs().amax((0, 2)) / (6 * 448.0)
        CALIB[(l, "v")] = v.abs().amax((0, 2)) / (6 * 448.0)


def center(model: Model, ids) -> None:
    cap: list = []
    model.forward(ids, None, capture=cap)
    for l, (_, k, v) in enumerate(cap):
        CENTER[(l, "k")] = k.mean(0)
        CENTER[(l, "v")] = v.mean(0)
        e = (k.mean(0).pow(2).sum() / k.pow(2).sum(-1).mean()).item()
        if l % 5 == 0:
            print(f"layer {l}: K mean energy / K energy {e:.3f}")


def smooth_calibrate(model: Model, ids) -> None:
    """SMOOTH's maxima from the calibration text (windows of 512 tokens, as GPTQ's)."""
    from models.quant.kv_smooth import pair_norm
    kmax = vmax = None
    for w0 in range(0, len(ids) - 511, 512):
        cap: list = []
        model.forward(ids[w0:w0 + 512], None, capture=cap)
        km = torch.stack([torch.from_numpy(pair_norm(k.numpy())).amax(0) for _, k, _ in cap])
        vm = torch.stack([v.abs().amax(0) for _, _, v in cap])
        kmax = km if kmax is None else torch.maximum(kmax, km)
        vmax = vm if vmax is None else torch.maximum(vmax, vm)
    SMOOTH["kmax"], SMOOTH["vmax"] = kmax.numpy(), vmax.numpy()


def premean_calibrate(model: Model, ids) -> None:
    """PREMEAN from the calibration text (512-token windows): K un-rotated to position 0, averaged."""
    C.ROPE = model
    acc, n = None, 0
    for w0 in range(0, len(ids) - 511, 512):
        cap: list = []
        model.forward(ids[w0:w0 + 512], None, capture=cap)
        pre = torch.stack([model.rope(k, -torch.arange(512)).sum(0) for _, k, _ in cap])  # R_-n undoes R_n
        acc, n = (pre if acc is None else acc + pre), n + 512
    for l in range(model.L):
        PREMEAN[l] = acc[l] / n


def notes_ids(tokenizer) -> list[int]:
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "assets" / "notes").glob("*.md")))
    return tokenizer.encode(text, add_special_tokens=False).ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="kv_probe")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--variants", default="nvfp4,nvfp4r")
    ap.add_argument("--stats", action="store_true")
    ap.add_argument("--own", action="store_true", help="chunk's own tokens unquantised")
    ap.add_argument("--own-page", action="store_true", help="a query's own 16-token page unquantised")
    ap.add_argument("--ref", default="f16")
    ap.add_argument("--calib-ctx", type=int, default=0, help="calibrate nvfp4h on the first N tokens (of the same text)")
    a = ap.parse_args(argv)
    from tokenizers import Tokenizer

    folder = ROOT / "models" / "weights" / "smollm2-135m" / "f32"
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model = Model(folder)
    ids = eval_ids(tok, a.ctx)
    print(f"{len(ids)} tokens")
    if a.stats:
        stats(model, ids)
    if "c:" in a.variants:
        center(model, notes_ids(tok))
    if "cr:" in a.variants:
        premean_calibrate(model, tok.encode((ROOT / "assets" / "calib" / "mixed.txt").read_text(),
                                            add_special_tokens=False).ids)
    if "sm" in a.variants:
        smooth_calibrate(model, tok.encode((ROOT / "assets" / "calib" / "mixed.txt").read_text(),
                                           add_special_tokens=False).ids)
    if a.calib_ctx:
        calibrate(model, ids[: a.calib_ctx])
    t = time.time()
    ref = model.forward(ids, codec(a.ref))
    print(f"ref {a.ref}: {time.time() - t:.1f} s")
    for name in a.variants.split(","):
        t = time.time()
        q = model.forward(ids, codec(name), own_unquantised=a.own, own_page=a.own_page)
        top1, pr = score(ref, q, ids)
        tail = score(ref[-512:], q[-512:], ids[-512:])
        print(f"{name:18s} top1 {top1:.3f}  ppl x{pr:.4f}   last512 top1 {tail[0]:.3f}  ({time.time() - t:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
