"""The 8-bit embedding (int8 rows, f16 scale per 32: W8A8 / GGUF Q8_0) as the backend's embed
op reads it, against numpy and against gguf-py's own Q8_0 dequantisation."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import _native
from models.quant.w8a8 import dequantize_w8a8, quantize_w8a8

BACKENDS = list(_native.backends())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H", [64, 72, 576])
def test_embed_rows_decode_as_numpy(backend, H):
    rng = np.random.default_rng(H)
    table = (rng.standard_normal((300, H)) * rng.uniform(0.01, 3, (300, 1))).astype(np.float32)
    q = quantize_w8a8(table)  # codes i8 [V, Kp], scales f16 [V, Kp/32]
    ids = np.array([0, 299, 17, 17, 150], np.int32)
    ops = _native.BackendOps(backend, 2)
    got = ops.embed_w8a8(q["codes"], q["scales"].view(np.uint16), ids, H)
    want = dequantize_w8a8(q["codes"], q["scales"], H)[ids]
    np.testing.assert_array_equal(got, want)  # one f32 product per value: exact
    with pytest.raises(ValueError, match="outside the table"):
        ops.embed_w8a8(q["codes"], q["scales"].view(np.uint16), np.array([300], np.int32), H)


def test_embed_rows_decode_as_gguf_py():
    gguf = pytest.importorskip("gguf")
    from models.quant.gguf_blocks import q8_0_to_w8a8

    table = np.random.default_rng(9).standard_normal((40, 96)).astype(np.float32)
    raw = gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0)
    q = q8_0_to_w8a8(raw, 40, 96)
    ids = np.arange(40, dtype=np.int32)[::-1].copy()
    got = _native.BackendOps("cpu", 1).embed_w8a8(q["codes"], q["scales"].view(np.uint16), ids, 96)
    np.testing.assert_array_equal(got, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)[ids])
