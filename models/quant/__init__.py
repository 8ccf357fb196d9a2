"""Number formats of kvdeck weights: numpy reference codecs (no torch, no `app`).

Submodules: e4m3, e2m1 (scalar formats), nvfp4, w4a8 (weight tensors), q8 (run-time
activations, oracle of the C++ kernel). This file adds the per-linear helpers used by the
converter and the loader: the safetensors entries of one linear weight, under the
suffixes of docs/ENGINE.md (prefix them with the module name, e.g. "model.layers.0.mlp.up_proj.").
"""
from __future__ import annotations

import numpy as np

from .nvfp4 import Nvfp4Tensor, dequantize_nvfp4, quantize_nvfp4
from .w4a8 import W4a8Tensor, dequantize_w4a8, quantize_w4a8

__all__ = ["FORMATS", "quantize_linear", "dequantize_linear"]

FORMATS = ("nvfp4", "w4a8", "f16", "f32")


def quantize_linear(w, fmt: str, group: int | None = 32, recipe: str = "mse") -> dict[str, np.ndarray]:
    """f32 [N, K] weight -> safetensors entries by suffix.

    recipe: scale recipe of nvfp4/w4a8, "mse" (default) or "amax" (see nvfp4.py / w4a8.py).

    nvfp4: {"weight.codes": u8 [N,Kp/2], "weight.scales": u8 [N,Kp/16], "weight.tscale": f32 [1]}
    w4a8:  {"weight.codes": u8 [N,Kp/2], "weight.scales": f16 [N,Kp/group]}  (group None/0: row-wise)
    f16 / f32: {"weight": f16 / f32 [N, K]}
    """
    w = np.ascontiguousarray(w, dtype=np.float32)  # w: f32 [N, K]
    if fmt == "nvfp4":
        t = quantize_nvfp4(w, recipe=recipe)
        return {"weight.codes": t.codes, "weight.scales": t.scales,
                "weight.tscale": np.array([t.tscale], dtype=np.float32)}
    if fmt == "w4a8":
        t = quantize_w4a8(w, group, recipe=recipe)
        return {"weight.codes": t.codes, "weight.scales": t.scales}
    if fmt == "w8a8":
        from .w8a8 import quantize_w8a8

        t = quantize_w8a8(w)
        return {"weight.codes": t["codes"], "weight.scales": t["scales"]}
    if fmt == "f16":
        return {"weight": w.astype(np.float16)}
    if fmt == "f32":
        return {"weight": w}
    raise ValueError(f"unknown weight format {fmt!r}; expected one of {FORMATS}")


def dequantize_linear(entries: dict[str, np.ndarray], fmt: str, K: int) -> np.ndarray:
    """Inverse of quantize_linear: entries by suffix -> f32 [N, K]."""
    if fmt == "nvfp4":
        tscale = np.float32(np.asarray(entries["weight.tscale"], dtype=np.float32).reshape(-1)[0])
        return dequantize_nvfp4(Nvfp4Tensor(entries["weight.codes"], entries["weight.scales"],
                                            tscale, int(K)))
    if fmt == "w4a8":
        codes, scales = entries["weight.codes"], entries["weight.scales"]
        Kp = codes.shape[1] * 2
        return dequantize_w4a8(W4a8Tensor(codes, scales, Kp // max(scales.shape[1], 1), int(K)))
    if fmt in ("f16", "f32"):
        return np.ascontiguousarray(np.asarray(entries["weight"], dtype=np.float32)[:, :K])
    raise ValueError(f"unknown weight format {fmt!r}; expected one of {FORMATS}")
