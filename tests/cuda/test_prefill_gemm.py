"""The prefill GEMM through the engine (on a GPU): a 200-token prefill of a random SmolLM2-
shaped model runs q/k/v and gate/up as one grouped tensor-core launch each (matmul_many, M > 8)
and o / down / lm_head as single ones. Its logits are compared with the CPU engine's on the
same bytes, and so are those of the same CUDA engine with the GEMM switched off
(KVDECK_CUDA_MMA=0: every matmul as batch-8 GEMV chunks, one weight at a time, the path the
GEMM replaced). Both compute the same block sums, only the f32 summation order differs, but
30 random layers amplify a last-bit difference (an int8 activation rounding that flips) to
~1e-3 (measured: GEMM vs chunks 5.6e-3 on this model), so the bound is relative: the GEMM may
deviate from the CPU at most 3x as much as the chunks do (floor 1e-3); a wrong tile, scale or
grouped offset gives O(1).
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
    cpu = _prefill_logits(gpu_model.build("smollm2-135m", weights, "f16", "cpu", tensors=t, head=head), ids)
    gemm = _prefill_logits(gpu_model.build("smollm2-135m", weights, "f16", "cuda", tensors=t, head=head), ids)
    monkeypatch.setenv("KVDECK_CUDA_MMA", "0")  # read when the backend is created
    chunks = _prefill_logits(gpu_model.build("smollm2-135m", weights, "f16", "cuda", tensors=t, head=head), ids)
    assert np.isfinite(gemm).all()

    def rel(a):
        return float(np.abs(a - cpu).max() / np.abs(cpu).max())

    agree_g, agree_c = (gemm.argmax(1) == cpu.argmax(1)).mean(), (chunks.argmax(1) == cpu.argmax(1)).mean()
    print(f"\n{weights} layers, {head} head, 200-token prefill vs the CPU engine: GEMM {rel(gemm):.2e} "
          f"(top-1 {agree_g:.3f}), GEMV chunks {rel(chunks):.2e} (top-1 {agree_c:.3f})")
    assert rel(gemm) <= max(3 * rel(chunks), 1e-3), (rel(gemm), rel(chunks))
    assert agree_g >= agree_c - 0.05, (agree_g, agree_c)
