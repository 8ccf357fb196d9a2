"""Error-compensating rounding (GPTQ; Frantar et al. 2022) within kvdeck's 4-bit formats.

Per linear y = x W^T (W [N, K]) and calibration inputs X [n, K], GPTQ rounds W column by
column and spreads each column's rounding error over the columns not yet rounded, weighted
by the inverse Hessian of the layer's squared output error, H = X^T X:
    H    += damp * mean(diag H) * I              (damp = 0.01; dead inputs: H_kk = 1, W_:k = 0)
    U     = cholesky(H^-1)^T                     (upper; U_kk^2 is the conditional variance)
    for k = 0 .. K-1 (blocks of BLOCK columns, updates beyond a block applied lazily):
        at the first column of a scale group: pick the group's scale from the current
        (already error-updated) columns by the format's own "mse" recipe (nvfp4.py / w4a8.py)
        q_k   = round(W_:k) on that grid         (nvfp4: E2M1 code x E4M3 block scale x g;
                                                  w4a8: clip(rint(w/d), -8, 7) x f16 d)
        e     = (W_:k - q_k) / U_kk
        W_:j -= e * U_kj   for j > k             (the error feedback)
The codes and scales are the format's (docs/ENGINE.md): the engine runs them unchanged; only
which grid point each weight takes differs from round-to-nearest.
act_order (gptq_linear; off in the converter): columns in order of decreasing H_kk with the
scales fixed beforehand from the source weights. Measured on SmolLM2-135M layer 3: output
error q_proj 0.00118 -> 0.00098 (nvfp4), down_proj 0.00303 -> 0.00330: no clear gain.

gptq_model runs the source model (models/quant/reference_forward.py, float64 torch) over the
calibration text (assets/calib/mixed.txt, windows of WINDOW tokens) layer by layer: each
layer's linears are rounded against the inputs that the already-rounded layers before them
produce (as the GPTQ paper does), in forward order q/k/v, o, gate/up, down.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import nvfp4 as _nv
from . import w4a8 as _w4
from .e2m1 import E2M1_VALUES, encode_e2m1
from .e4m3 import decode_e4m3, encode_e4m3

CALIB_TEXT = Path(__file__).resolve().parents[2] / "assets" / "calib" / "mixed.txt"
WINDOW = 512   # tokens per calibration sequence
BLOCK = 128    # columns per lazy-update block (a multiple of both formats' groups)
DAMP = 0.01


def calibration_record(path: Path = CALIB_TEXT) -> dict:
    """config.json's weights.recipe.calibration: the text's name and sha256."""
    if not path.is_file():
        from ..errors import ModelError

        raise ModelError(f"{path}: the GPTQ calibration text is missing")
    return {"text": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "window": WINDOW}


# ============================================================================
# One linear
# ============================================================================
def inverse_factor(H: torch.Tensor, act_order: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """H [K, K] (X^T X) -> (U f64 upper [K, K], dead bool [K], perm): the damped inverse's
    Cholesky factor (of H permuted by perm when act_order: columns by decreasing H_kk), and
    the inputs that never fire (their weights are zeroed)."""
    H = H.to(torch.float64).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    H += DAMP * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], dtype=H.dtype)
    perm = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order else None
    if perm is not None:
        H = H[perm][:, perm]
    L = torch.linalg.cholesky(H)
    Hinv = torch.cholesky_inverse(L)
    return torch.linalg.cholesky(Hinv, upper=True), dead, perm


class _Nvfp4Grid:
    """nvfp4 rounding: tensor scale g from the source W (nvfp4.py), block scales by "mse"."""
    G = _nv.NVFP4_BLOCK

    def __init__(self, W: np.ndarray):
        amax = np.float32(np.abs(W).max(initial=np.float32(0)))
        self.g = np.float32(amax / np.float32(2688.0)) if amax > 0 else np.float32(1.0)
        self.values = torch.from_numpy(E2M1_VALUES.copy())

    def scales(self, wg: np.ndarray) -> np.ndarray:
        """wg f32 [N, G] (current columns) -> u8 E4M3 codes [N]."""
        wb = wg[:, None, :]
        bmax = np.abs(wb).max(axis=2)
        s6 = encode_e4m3(bmax / (np.float32(6.0) * self.g))
        return _nv._mse_scales(wb, bmax, s6, self.g)[:, 0]

    def den(self, s: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(decode_e4m3(s) * self.g)  # f32 [N]

    def round(self, w: torch.Tensor, den: torch.Tensor):
        """w f64 [N] -> (codes u8 [N] as numpy, dequantised f64 [N], as the engine's f32
        product of code value and scale); den 0: code 0."""
        ok = den != 0
        c = encode_e2m1((w / torch.where(ok, den, 1.0).to(torch.float64)).numpy())
        c[~ok.numpy()] = 0
        return c, (self.values[torch.from_numpy(c.astype(np.int64))] * den).to(torch.float64)


class _W4a8Grid:
    """w4a8 rounding: f16 scale per group by "mse" (w4a8.py), q = clip(rint(w/d), -8, 7)."""

    def __init__(self, W: np.ndarray, group: int):
        self.G = group

    def scales(self, wg: np.ndarray) -> np.ndarray:
        return _w4._mse_scales(wg[:, None, :])[:, 0]  # f16 [N]

    def den(self, s: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(s.astype(np.float32))

    def round(self, w: torch.Tensor, den: torch.Tensor):
        ok = den != 0
        q = torch.clamp(torch.round(w / torch.where(ok, den, 1.0).to(torch.float64)), -8, 7)
        q = torch.where(ok, q, 0.0)
        return q.numpy().astype(np.int8), q * den.to(torch.float64)  # exact: q is small, den an f16


def gptq_linear(W: np.ndarray, H: torch.Tensor | None, fmt: str, group: int = 32,
                factor: tuple | None = None, act_order: bool = False) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """W f32 [N, K], H [K, K] (X^T X of the calibration inputs; or its `factor`, from
    inverse_factor, when several linears share the input) -> (entries by suffix as
    models.quant.quantize_linear returns them, dequantised f32 [N, K]).
    The error feedback runs in float64: in float32 the result depended on the machine (torch's
    AVX-512 and AVX2 GEMMs sum in different orders, the error feedback amplifies the last-bit
    differences into other roundings; measured w4a8 perplexity 1.190x / 1.220x / 1.238x f32 from
    the same source on three CPU paths). Runs on one torch thread (its steps are small)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _gptq_linear(W, factor or inverse_factor(H, act_order), fmt, group)
    finally:
        torch.set_num_threads(threads)


def _gptq_linear(W, factor, fmt, group):
    N, K = W.shape
    if K % 32:
        raise ValueError(f"gptq_linear: K = {K} is not a multiple of 32")
    grid = _Nvfp4Grid(W) if fmt == "nvfp4" else _W4a8Grid(W, group)
    G = grid.G
    if BLOCK % G:
        raise ValueError(f"gptq_linear: group {G} does not divide the block {BLOCK}")
    Wt = torch.from_numpy(np.array(W, dtype=np.float64))
    U, dead, perm = factor
    Wt[:, dead] = 0.0
    codes = np.zeros((N, K), np.int8 if fmt == "w4a8" else np.uint8)
    scales = np.zeros((N, K // G), np.float16 if fmt == "w4a8" else np.uint8)
    Q = torch.zeros_like(Wt)
    if perm is not None:  # act order: static scales (the source's own mse scales), permuted columns
        for g in range(K // G):
            scales[:, g] = grid.scales(Wt[:, g * G:(g + 1) * G].numpy().astype(np.float32))
        dens = torch.stack([grid.den(scales[:, g]) for g in range(K // G)], 1)  # [N, K/G]
        pn = perm.numpy()
        Wt = Wt[:, perm].contiguous()
        for b0 in range(0, K, BLOCK):
            b1 = min(K, b0 + BLOCK)
            W1, U1 = Wt[:, b0:b1].clone(), U[b0:b1, b0:b1]
            E1 = torch.zeros_like(W1)
            for i in range(b1 - b0):
                k = int(pn[b0 + i])
                w = W1[:, i]
                c, q = grid.round(w, dens[:, k // G])
                codes[:, k], Q[:, k] = c, q
                e = (w - q) / U1[i, i]
                W1[:, i:] -= e[:, None] * U1[i, i:][None, :]
                E1[:, i] = e
            Wt[:, b1:] -= E1 @ U[b0:b1, b1:]
    for b0 in range(0, K if perm is None else 0, BLOCK):
        b1 = min(K, b0 + BLOCK)
        W1 = Wt[:, b0:b1].clone()
        E1 = torch.zeros_like(W1)
        U1 = U[b0:b1, b0:b1]
        den = None
        for i in range(b1 - b0):
            k = b0 + i
            if k % G == 0:
                s = grid.scales(W1[:, i:i + G].numpy().astype(np.float32))
                scales[:, k // G] = s
                den = grid.den(s)
            w = W1[:, i]
            c, q = grid.round(w, den)
            codes[:, k] = c
            Q[:, k] = q
            e = (w - q) / U1[i, i]
            W1[:, i:] -= e[:, None] * U1[i, i:][None, :]
            E1[:, i] = e
        Wt[:, b1:] -= E1 @ U[b0:b1, b1:]
    if fmt == "w4a8":
        entries = {"weight.codes": _nv.pack_nibbles((codes + 8).view(np.uint8)), "weight.scales": scales}
    else:
        entries = {"weight.codes": _nv.pack_nibbles(codes), "weight.scales": scales,
                   "weight.tscale": np.array([grid.g], np.float32)}
    return entries, Q.numpy().astype(np.float32)  # exact: each entry is an f32 product


def output_error(W: np.ndarray, Wq: np.ndarray, X: np.ndarray) -> float:
    """Relative squared output error ||X Wq^T - X W^T||^2 / ||X W^T||^2 (float64)."""
    X64 = X.astype(np.float64)
    ref = X64 @ W.astype(np.float64).T
    return float(((X64 @ Wq.astype(np.float64).T - ref) ** 2).sum() / (ref ** 2).sum())


# ============================================================================
# The model, layer by layer over the calibration text
# ============================================================================
def calibration_ids(tokenizer_json: str, path: Path = CALIB_TEXT) -> np.ndarray:
    """The calibration text as int64 [B, WINDOW] (whole windows; the tail is dropped)."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_str(tokenizer_json).encode(path.read_text(encoding="utf-8"), add_special_tokens=False).ids
    B = len(ids) // WINDOW
    if B < 1:
        raise ValueError(f"{path}: {len(ids)} tokens, fewer than one window of {WINDOW}")
    return np.asarray(ids[: B * WINDOW], np.int64).reshape(B, WINDOW)


def gptq_model(src, fmt: str, recipe: dict, log: Callable[[str], None] = lambda s: None) -> dict[str, np.ndarray]:
    """Every layer linear of a ModelSource rounded by GPTQ into `fmt` (nvfp4 | w4a8):
    {safetensors name: array} ("model.layers.3.mlp.up_proj.weight.codes", ...). The
    embedding, norms and head are left to the converter."""
    from .reference_forward import TorchLlama

    t0 = time.time()
    tensors = dict(src.tensors())
    m = TorchLlama(src.meta, tensors, dtype=torch.float64)  # machine-independent (gptq_linear)
    ids = calibration_ids(src.tokenizer_json)
    group = int(recipe.get("w4a8_group", 32))
    out: dict[str, np.ndarray] = {}
    hess: list = []  # [(input, H)]: the input is held, so its storage cannot be reused

    def lin(name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not (hess and hess[0][0].data_ptr() == x.data_ptr() and hess[0][0].shape == x.shape):
            # q/k/v and gate/up share an input: one Hessian (x is float64: the forward is)
            hess[:] = [(x, inverse_factor(x.T @ x))]
        entries, wq = gptq_linear(w.numpy().astype(np.float32), None, fmt, group, factor=hess[0][1])
        out.update({f"{name}.{k}": v for k, v in entries.items()})
        m.set_weight(name, wq)
        return x @ torch.from_numpy(wq).to(x.dtype).T

    with torch.no_grad():
        x = m.embed(ids)
        for l in range(m.L):
            x = m.layer(l, x, lin)
            hess.clear()
            if (l + 1) % 10 == 0 or l + 1 == m.L:
                log(f"gptq {fmt}: layer {l + 1}/{m.L} ({time.time() - t0:.0f} s)")
    log(f"gptq {fmt}: {m.L} layers over {ids.size} calibration tokens in {time.time() - t0:.1f} s")
    return out
