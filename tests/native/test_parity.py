"""Logits parity of the f32 engine against Hugging Face transformers and a numpy forward.

Both oracles run on the same dequantised weights (the f32 folder: GGUF Q4_1 dequantised
exactly). Tolerances come from measurement (2026-11-30, these four prompts, logits up to
~40 in magnitude): max |ours - transformers f32| 3.5e-5..1.3e-4, max |ours - numpy f64|
2.4e-5..5.1e-5 (transformers itself is 4.3e-5..8.9e-5 from numpy). We assert 5e-4.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.numpy_llama import NumpyLlama

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n",
    "Jetson Orin: 2048 CUDA cores, 64 GB LPDDR5, 204.8 GB/s. " * 3,
]
MAX_ABS = 5e-4


@pytest.fixture(scope="module")
def f32(engine):
    return engine("f32", "f32")


@pytest.fixture(scope="module")
def hf_model(root):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import json

    from safetensors.numpy import load_file

    cfg = json.loads((root / "f32" / "config.json").read_text())
    hc = transformers.LlamaConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"],
        max_position_embeddings=cfg["max_position_embeddings"],
        tie_word_embeddings=cfg["tie_word_embeddings"],
    )
    model = transformers.LlamaForCausalLM(hc).eval().to(torch.float32)
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in load_file(str(root / "f32" / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    model.tie_weights()
    return model


def _ids(eng, text):
    return eng.tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("prompt", PROMPTS)
def test_f32_engine_matches_transformers(f32, hf_model, prompt):
    import torch

    ids = _ids(f32, prompt)
    ours = f32.logits(ids)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].numpy()
    diff = np.abs(ours - ref).max()
    assert diff < MAX_ABS, f"max |ours - transformers| = {diff:.2e} over {len(ids)} tokens"
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_f32_engine_matches_numpy_reference(f32, root):
    ref_model = NumpyLlama(root / "f32")
    for prompt in PROMPTS[:2]:
        ids = _ids(f32, prompt)
        diff = np.abs(f32.logits(ids) - ref_model.logits(ids)).max()
        assert diff < MAX_ABS, f"max |ours - numpy| = {diff:.2e}"


def test_decode_steps_equal_one_prefill(f32):
    """Token-by-token decode over paged KV gives the logits of one batched prefill."""
    ids = _ids(f32, PROMPTS[3])[:40]  # crosses two page boundaries (block 16)
    full = f32.logits(ids)
    seq = f32.native.open_sequence()
    try:
        f32.native.forward(seq, np.array(ids[:5], np.int32))
        steps = [f32.native.forward(seq, np.array([t], np.int32)) for t in ids[5:]]
    finally:
        f32.native.close_sequence(seq)
    diff = np.abs(np.stack(steps) - full[5:]).max()
    assert diff < 1e-4, f"decode vs prefill logits differ by {diff:.2e}"


def test_f16_weights_track_f32(engine):
    """f16 weights: same greedy tokens as f32 on a short prompt, logits within f16 rounding."""
    f32, f16 = engine("f32", "f32"), engine("f16", "f16")
    ids = _ids(f32, PROMPTS[0])
    a, b = f32.logits(ids), f16.logits(ids)
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.8
    assert np.abs(a - b).max() < 0.5
