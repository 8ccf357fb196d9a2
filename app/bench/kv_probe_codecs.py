"""KV codecs of the KV error study (app/bench/kv_probe.py): float32 torch models of number
formats and of ways to round a layer's K / V rows, named by the variant strings kv_probe's
docstring lists. Rounding uses torch's own float8_e4m3fn cast (code we did not write) for E4M3.
"""

from __future__ import annotations

import math

import torch

# =====================================================================================
# Number formats (float32 torch)
# =====================================================================================

E2M1_LEVELS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to float8_e4m3fn (RNE, saturating at 448) and back."""
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)


def e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to E2M1 (ties as formats.cpp: to the even code) and back."""
    a = x.abs()
    code = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() + (a > 2.5).int()
            + (a >= 3.5).int() + (a > 5.0).int())
    return E2M1_LEVELS[code] * torch.sign(x)


def f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float32)


def nvfp4_blocks(x: torch.Tensor, g: torch.Tensor | None, mse: bool = False, B: int = 16) -> torch.Tensor:
    """x [..., D] -> dequantised NVFP4 (blocks of 16 along the last dim). g: the second-level
    scale broadcastable to x[..., :1] (None: 1, today's KV). mse: per block, the E4M3 scale
    among s6, s6±1 code steps (approximated by ×/÷ 2^(1/8)) and s4 with the least squared error."""
    shp = x.shape
    xb = x.reshape(*shp[:-1], shp[-1] // B, B)
    gg = torch.ones(()) if g is None else g.unsqueeze(-1)
    y = xb / gg
    amax = y.abs().amax(-1, keepdim=True)
    cands = [amax / 6.0]
    if mse:
        cands += [amax / 5.0, amax / 4.0, amax / 6.5, amax / 5.5]
    best, berr = None, None
    for c in cands:
        s = e4m3(c)
        q = torch.where(s > 0, e2m1(y / torch.where(s > 0, s, torch.ones(()))) * s, torch.zeros(()))
        err = ((q - y) ** 2).sum(-1, keepdim=True)
        if best is None:
            best, berr = q, err
        else:
            take = err < berr
            best, berr = torch.where(take, q, best), torch.where(take, err, berr)
    return (best * gg).reshape(shp)


def fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """E4M3 per value with an f16 scale per row (row max on 448)."""
    g = f16(x.abs().amax(-1, keepdim=True) / 448.0).clamp_min(2**-24)
    return e4m3(x / g) * g


def pages_of_16(x: torch.Tensor, fn) -> torch.Tensor:
    """fn over blocks of 16 tokens of one channel: x [T, nkv, D] (the page's 16 rows; a last
    partial page is rounded over its rows only, as if the page were complete)."""
    T = x.shape[0]
    out = torch.empty_like(x)
    for p0 in range(0, T, 16):
        blk = x[p0:p0 + 16].permute(1, 2, 0)  # [nkv, D, n]
        out[p0:p0 + 16] = fn(blk).permute(2, 0, 1)
    return out


def int4_asym_f16(y: torch.Tensor) -> torch.Tensor:
    """Asymmetric int4 over the last axis: lo = f16(min), d = f16((max - lo) / 15)."""
    lo = f16(y.amin(-1, keepdim=True))
    d = f16((y.amax(-1, keepdim=True) - lo) / 15)
    return torch.round((y - lo) / torch.where(d > 0, d, 1.0)).clamp(0, 15) * d + lo


_E4M3_GRID = None


def _grid() -> None:
    """_E4M3_GRID: every finite E4M3 value, ascending."""
    global _E4M3_GRID
    if _E4M3_GRID is None:
        g = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        _E4M3_GRID = g[torch.isfinite(g)].unique().sort().values


def int4_asym_e4m3(y: torch.Tensor) -> torch.Tensor:
    """Asymmetric int4 with one byte each for lo and d: lo = E4M3 at or below min, d = E4M3 at
    or above (max - lo) / 15 (directed rounding keeps every value in range): 10 B per 16 values."""
    _grid()
    G = _E4M3_GRID
    lo = G[(torch.searchsorted(G, y.amin(-1, keepdim=True).contiguous(), right=True) - 1).clamp(min=0)]
    d = G[torch.searchsorted(G, ((y.amax(-1, keepdim=True) - lo) / 15).contiguous()).clamp(max=len(G) - 1)]
    return torch.round((y - lo) / torch.where(d > 0, d, 1.0)).clamp(0, 15) * d + lo


def int4_window_int8(y: torch.Tensor) -> torch.Tensor:
    """Asymmetric int4 over the last axis as a 16-step window on a grid of step d: value =
    (z + code) d with z = floor(min / d) in int8 and d the smallest E4M3 value, from range / 15
    up, whose window [z d, (z + 15) d] covers the block: 10 B per 16 values, and the window's
    offset costs no rounding of its own."""
    _grid()
    G = _E4M3_GRID
    mn, mx = y.amin(-1, keepdim=True), y.amax(-1, keepdim=True)
    need = torch.maximum((mx - mn) / 15, torch.maximum(mn.clamp(min=0) / 127, (-mn).clamp(min=0) / 128))
    i0 = torch.searchsorted(G, need.contiguous())
    d = z = None
    for j in (2, 1, 0):  # the smallest covering candidate wins (range / 14 always covers)
        dj = G[(i0 + j).clamp(max=len(G) - 1)]
        dj = torch.where(dj > 0, dj, 1.0)
        zj = torch.floor(mn / dj).clamp(-128, 127)
        ok = (zj + 15) * dj >= mx
        d = dj if d is None else torch.where(ok, dj, d)
        z = zj if z is None else torch.where(ok, zj, z)
    return (z + torch.round(y / d - z).clamp(0, 15)) * d


def hadamard(D: int) -> torch.Tensor:
    H = torch.ones(1, 1)
    while H.shape[0] < D:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    return H / math.sqrt(D)


# =====================================================================================
# KV codecs: fn(x [T, nkv, D], layer, which "k"|"v") -> dequantised x
# =====================================================================================

def row_scale(x):  # f16 per (token, head) row: row max lands on 6 * 448
    return f16(x.abs().amax(-1, keepdim=True) / (6 * 448.0)).clamp_min(2**-24)


CENTER: dict = {}  # (layer, which) -> mean row [nkv, D] (set by --center)
CALIB: dict = {}  # (layer, which) -> per-head f32 scale [nkv] (set by --calib)
PREMEAN: dict = {}  # layer -> pre-RoPE mean of K [nkv, D] on the calibration text (set for "cr:")
ROPE = None  # the Model (its rope) for "cr:"
SMOOTH: dict = {}  # "kmax" [L, nkv, D/2], "vmax" [L, nkv, D] on the calibration text; (a, av, level) -> (s, t)


def codec(name: str):
    H = hadamard(64)

    def one(kind, x, layer, which):
        if kind == "f16":
            return f16(x)
        if kind == "f32":
            return x
        if kind == "nvfp4":  # today: second-level scale 1
            return nvfp4_blocks(x, None)
        if kind == "nvfp4r":  # f16 scale per row
            return nvfp4_blocks(x, row_scale(x))
        if kind == "nvfp4rm":  # f16 scale per row + mse block scales
            return nvfp4_blocks(x, row_scale(x), mse=True)
        if kind == "nvfp4h":  # calibrated per (layer, head) f32 scale
            g = CALIB[(layer, which)].view(1, -1, 1)
            return nvfp4_blocks(x, g)
        if kind == "nvfp4b8":  # blocks of 8, scale 1
            return nvfp4_blocks(x, None, B=8)
        if kind == "nvfp4b8m":
            return nvfp4_blocks(x, None, mse=True, B=8)
        if kind == "nvfp4m":  # scale 1, mse block scales
            return nvfp4_blocks(x, None, mse=True)
        if kind in ("pcf", "pce", "pcz"):  # per channel along 16-token pages: asymmetric int4
            return pages_of_16(x, {"pcf": int4_asym_f16, "pce": int4_asym_e4m3, "pcz": int4_window_int8}[kind])
        if kind == "fp8":
            return fp8_rows(x)
        if kind == "int8":  # symmetric int8 with an f16 scale per row
            g = f16(x.abs().amax(-1, keepdim=True) / 127.0).clamp_min(2**-24)
            return torch.round(x / g).clamp(-127, 127) * g
        raise ValueError(kind)

    # name: "<k>/<v>" or one codec for both; "+h" suffix: Hadamard-rotate K before rounding
    parts = name.split("/") if "/" in name else [name, name]

    def fn(x, layer, which):
        kind = parts[0] if which == "k" else parts[1]
        if kind.startswith("s:"):  # the first 16 tokens (one page) kept in f16: attention sinks
            return torch.cat([f16(x[:16]), fn(x[16:], layer, which) if False else fn_kind(kind[2:], x[16:], layer, which)])
        return fn_kind(kind, x, layer, which)

    def fn_kind(kind, x, layer, which):
        if kind.startswith("sm"):  # smoothed: round x / s, read back times s
            head, rest = kind[2:].split(":", 1)
            a, _, lev = head.partition("@")
            key = (*map(float, a.split("_")), float(lev or 32))
            if key not in SMOOTH:
                from models.quant.kv_smooth import factors
                SMOOTH[key] = tuple(map(torch.from_numpy, factors(SMOOTH["kmax"], SMOOTH["vmax"], key[0], key[1], key[2])))
            f = SMOOTH[key][0 if which == "k" else 1][layer]
            return fn_kind(rest, x / f, layer, which) * f
        if kind.startswith("cr:"):  # minus the calibrated mean rotated to each row's position
            mu = ROPE.rope(PREMEAN[layer].expand(x.shape[0], -1, -1), torch.arange(x.shape[0]))
            return fn_kind(kind[3:], x - mu, layer, which) + mu
        if kind.startswith("c:"):  # K minus a calibrated per-(layer, head) mean: q·k̄ is the
            # same for every key of a query, so softmax ignores it; the rounding sees k - k̄
            mu = CENTER[(layer, which)]
            return fn2(kind[2:], x - mu, layer, which)
        return fn2(kind, x, layer, which)

    def fn2(kind, x, layer, which):
        rot = kind.endswith("+h")
        kind = kind.removesuffix("+h")
        if rot:  # q·k = (Hq)·(Hk): rounding Hk and rotating back is the same math
            return one(kind, x @ H.T, layer, which) @ H
        return one(kind, x, layer, which)

    return fn


