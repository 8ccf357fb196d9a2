"""The host's part of a CUDA decode step (on a GPU): the packed upload of the step's index
arrays and the pinned download of its token change nothing the step computes, and the step-
timing switch (KVDECK_CUDA_STEP_TIMING, the measurement of bench/decode_ab.py --host) neither:
its back-to-back second replay of a step gives the same tokens (a replay is idempotent)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app.engine import _native

pytestmark = [pytest.mark.cuda, pytest.mark.skipif("cuda" not in _native.backends(),
                                                   reason="no usable CUDA backend (build or GPU)")]
LAYERS = 4
OLD = {"KVDECK_STEP_PACK": "0", "KVDECK_CUDA_PINNED_DL": "0"}


@pytest.fixture(scope="module")
def tensors():
    from app.bench import gpu_model

    return gpu_model.random_tensors("smollm2-135m", "nvfp4", "w8a8", LAYERS, seed=11)


def _engine(tensors, env: dict[str, str], monkeypatch):
    from app.bench import gpu_model

    for k in ("KVDECK_STEP_PACK", "KVDECK_CUDA_PINNED_DL", "KVDECK_CUDA_STEP_TIMING", "KVDECK_CUDA_STEP_B2B"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return gpu_model.build("smollm2-135m", "nvfp4", "f16", "cuda", tensors=tensors, head="w8a8", layers=LAYERS)


def _decode(eng, b2b_from: int | None = None) -> tuple[list[int], list[np.ndarray]]:
    """28 greedy steps after 12 tokens (pages of 16 fill at 16 and 32), then 4 logits steps;
    from step b2b_from on, KVDECK_CUDA_STEP_B2B=1 (read at each replay)."""
    s = eng.open_sequence(0)
    toks = [eng.forward_greedy(s, np.arange(3, 15, dtype=np.int32), None)]
    try:
        for i in range(28):
            if b2b_from is not None and i == b2b_from:
                os.environ["KVDECK_CUDA_STEP_B2B"] = "1"
            toks.append(eng.forward_greedy(s, np.array([toks[-1]], np.int32), None))
    finally:
        os.environ.pop("KVDECK_CUDA_STEP_B2B", None)
    logits = [eng.forward(s, np.array([t], np.int32), False, None) for t in (5, 77, 901, 12)]
    eng.close_sequence(s)
    return toks, logits


def test_packed_upload_and_pinned_download_equal_the_old_path(tensors, monkeypatch):
    new = _decode(_engine(tensors, {}, monkeypatch))
    old = _decode(_engine(tensors, OLD, monkeypatch))
    assert new[0] == old[0]
    for a, b in zip(new[1], old[1]):
        np.testing.assert_array_equal(a, b)


def test_step_timing_and_back_to_back_replays_change_nothing(tensors, monkeypatch, tmp_path):
    want = _decode(_engine(tensors, {}, monkeypatch))
    path = tmp_path / "timing.txt"
    eng = _engine(tensors, {"KVDECK_CUDA_STEP_TIMING": str(path)}, monkeypatch)
    got = _decode(eng, b2b_from=14)
    del eng  # the file is written when the backend is destroyed
    assert got[0] == want[0]
    for a, b in zip(got[1], want[1]):
        np.testing.assert_array_equal(a, b)
    t = {k: float(v) for k, v in (f.split("=") for f in path.read_text().split())}
    print(f"\nstep timing ({LAYERS} layers): {t}")
    assert t["replays"] >= 10 and t["b2b_n"] >= 10, t
    assert 0 < t["gpu_b2b_us"] <= t["gpu_us"] * 1.2, t
    assert t["wait_us"] > 0 and t["outside_us"] > 0 and t["launch_us"] > 0, t
