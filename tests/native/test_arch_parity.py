"""The architecture paths the README lists, against transformers: Qwen2 q/k/v biases, Qwen3 q/k
RMSNorm (with head_dim != hidden / heads), Llama 3 RoPE scaling (rope_type "llama3").

Each test builds a tiny random HF model (2 layers, hidden 64, 4 heads / 2 KV heads, vocab 300,
weights N(0, 0.1), norms and biases perturbed by N(0, 0.3)), saves it with save_pretrained,
converts it with `kvdeck models convert --formats f32` (models.cli.main), loads the folder with
app.engine.load_engine and compares the logits of a 120-token prompt with transformers' own
forward in float32, for a whole prefill and for token-by-token decode over the paged KV.

Measured (2026-12-01, AVX2, logits up to ~4 in magnitude), max |ours - transformers| for
prefill / decode: qwen2 2.0e-6 / 1.7e-6, qwen3 3.7e-6 / 2.7e-6, llama3 3.3e-6 / 3.3e-6 (and
Llama 3's inv_freq equal bit for bit). We assert MAX_ABS = 2e-5. Each test also shows that the
feature matters by far more than that bound: transformers with the feature removed (biases
zeroed, q/k norms replaced by identity, rope_scaling dropped) moves the logits by 4.9, 2.8 and
2.8, against the asserted > 1000 x MAX_ABS = 0.02, so an engine that ignored the feature would
fail the comparison by five orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from app.engine import load_engine  # noqa: E402
from app.engine.loader import rope_inv_freq  # noqa: E402
from models.cli import main as models_main  # noqa: E402
from tests.unit.test_models_hf import write_tokenizer  # noqa: E402

MAX_ABS = 2e-5
SENSITIVITY = 1000 * MAX_ABS
IDS = np.random.default_rng(1).integers(0, 256, 120).tolist()  # 120 positions > 32 = original context
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}
SIZES = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=257,
             eos_token_id=258, tie_word_embeddings=False, initializer_range=0.1)


def hf_model(arch: str, **extra):
    """A random tiny transformers model of ``arch`` (seeded), norms and biases perturbed."""
    torch.manual_seed(0)
    if arch == "qwen2":
        cfg, cls = transformers.Qwen2Config(**SIZES, **extra), transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg, cls = transformers.Qwen3Config(head_dim=32, **SIZES, **extra), transformers.Qwen3ForCausalLM
    else:
        cfg, cls = transformers.LlamaConfig(**SIZES, **extra), transformers.LlamaForCausalLM
    model = cls(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    return model


def hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float().numpy()


def convert_and_load(model, tmp_path, name: str):
    src = tmp_path / "src"
    model.save_pretrained(src)
    write_tokenizer(src, SIZES["vocab_size"])
    assert models_main(["convert", str(src), "--name", name, "--formats", "f32", "--out", str(tmp_path / "out")]) == 0
    return load_engine(tmp_path / "out" / name / "f32", max_context=256)


def check_parity(eng, ref: np.ndarray, what: str) -> None:
    """Prefill logits and token-by-token decode logits both within MAX_ABS of ``ref``."""
    ours = eng.logits(IDS)
    diff = np.abs(ours - ref).max()
    assert diff < MAX_ABS, f"{what}: max |ours - transformers| = {diff:.2e} over {len(IDS)} tokens"
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    seq = eng.native.open_sequence()
    try:
        eng.native.forward(seq, np.array(IDS[:100], np.int32))
        steps = np.stack([eng.native.forward(seq, np.array([t], np.int32)) for t in IDS[100:]])
    finally:
        eng.native.close_sequence(seq)
    diff = np.abs(steps - ref[100:]).max()
    assert diff < MAX_ABS, f"{what}: decode steps differ from transformers by {diff:.2e}"


def test_qwen2_qkv_bias(tmp_path):
    model = hf_model("qwen2")
    eng = convert_and_load(model, tmp_path, "tiny-qwen2")
    assert eng.config.architecture == "qwen2" and eng.config.attention_bias
    ref = hf_logits(model)
    check_parity(eng, ref, "qwen2")
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.zero_()
    assert np.abs(hf_logits(model) - ref).max() > SENSITIVITY, "the biases hardly change the logits"


def test_qwen3_qk_norm(tmp_path):
    model = hf_model("qwen3")
    eng = convert_and_load(model, tmp_path, "tiny-qwen3")
    assert eng.config.architecture == "qwen3" and eng.config.qk_norm and eng.config.head_dim == 32
    ref = hf_logits(model)
    check_parity(eng, ref, "qwen3")
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    assert np.abs(hf_logits(model) - ref).max() > SENSITIVITY, "the q/k norms hardly change the logits"


def test_llama3_rope_scaling(tmp_path):
    model = hf_model("llama", rope_theta=500000.0, rope_scaling=LLAMA3_SCALING)
    eng = convert_and_load(model, tmp_path, "tiny-llama3")
    assert eng.config.rope_scaling["rope_type"] == "llama3"
    hf_inv = model.model.rotary_emb.inv_freq.float().numpy()
    plain = (1.0 / 500000.0 ** (np.arange(0, 16, 2) / 16)).astype(np.float32)
    np.testing.assert_array_equal(rope_inv_freq(eng.config), hf_inv)
    assert np.abs(hf_inv - plain).max() > 1e-3 * plain.max(), "the scaling leaves inv_freq unchanged"
    ref = hf_logits(model)
    check_parity(eng, ref, "llama3")
    unscaled = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES, rope_theta=500000.0)).eval()
    unscaled.load_state_dict(model.state_dict())
    assert np.abs(hf_logits(unscaled) - ref).max() > SENSITIVITY, "rope scaling hardly changes the logits"
