"""The prefill GEMM through the engine (on a GPU): a 200-token prefill of a random SmolLM2-
shaped model runs q/k/v and gate/up as one grouped tensor-core launch each (matmul_many, M > 8)
and o / down / lm_head as single ones; its logits must match the same engine with the GEMM
switched off (KVDECK_CUDA_MMA=0: every matmul as batch-8 GEMV chunks, one weight at a time).
Both compute the same integer block sums; only the f32 summation order differs, which the 30
random layers amplify to ~1e-5 (a wrong tile, scale or grouped offset gives O(1)).
The op-level checks (every format, tails in M / N / K) are in test_backend_cuda.py; the kernel
against the GEMV chunks on the 8B shapes in native/kernels/cuda/bench/gemm/bench_gemm_mma.cu.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import _native

pytestmark = [pytest.mark.cuda, pytest.mark.skipif("cuda" not in _native.backends(),
                                                   reason="no usable CUDA backend (build or GPU)")]


def _prefill_logits(eng, ids: np.ndarray) -> np.ndarray:
    s = eng.open_sequence(0)
    try:
        return eng.forward(s, ids, True, None)
    finally:
        eng.close_sequence(s)


@pytest.mark.parametrize("weights, head", [("nvfp4", "w8a8"), ("w4a8", "w4a8")])
def test_grouped_gemm_prefill_equals_gemv_chunks(weights, head, monkeypatch):
    from app.bench import gpu_model

    t = gpu_model.random_tensors("smollm2-135m", weights, head, seed=5)
    ids = np.random.default_rng(5).integers(0, 49152, 200).astype(np.int32)
    gemm = _prefill_logits(gpu_model.build("smollm2-135m", weights, "f16", "cuda", tensors=t, head=head), ids)
    monkeypatch.setenv("KVDECK_CUDA_MMA", "0")  # read when the backend is created
    chunks = _prefill_logits(gpu_model.build("smollm2-135m", weights, "f16", "cuda", tensors=t, head=head), ids)
    assert np.isfinite(gemm).all()
    err = float(np.abs(gemm - chunks).max() / np.abs(chunks).max())
    agree = float((gemm.argmax(1) == chunks.argmax(1)).mean())
    print(f"\n{weights} layers, {head} head, 200-token prefill: GEMM vs GEMV chunks {err:.2e}, top-1 agree {agree:.3f}")
    assert err < 1e-3, err
    assert agree >= 0.97, agree
