"""Per-channel K / V smoothing folded into the weights (models/quant/kv_smooth.py) is exact.

Tiny random models (GQA 4 q heads over 2 KV heads, head_dim 16) through the pipeline's float32
reference forward (models/quant/reference_forward.py, which matches transformers): llama,
qwen2 (q/k/v biases) and qwen3 (q/k norms; one factor per layer shared by the heads). Folding
random factors changes no logit beyond float32 error; factors unequal within a RoPE pair do
(the constraint is real, so the test can fail).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from models.quant.kv_smooth import factors, fold, pair_norm  # noqa: E402
from models.quant.reference_forward import TorchLlama  # noqa: E402

L, H, NH, NKV, D, V, FF = 2, 32, 4, 2, 16, 50, 48


def tiny(arch: str, seed: int = 0):
    r = np.random.default_rng(seed)
    meta = {"num_hidden_layers": L, "hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": NKV,
            "head_dim": D, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "qk_norm": arch == "qwen3"}
    t = {"model.embed_tokens.weight": r.normal(0, 1, (V, H)), "model.norm.weight": 1 + 0.1 * r.normal(size=H)}
    for l in range(L):
        p = f"model.layers.{l}."
        shapes = {"self_attn.q_proj": (NH * D, H), "self_attn.k_proj": (NKV * D, H), "self_attn.v_proj": (NKV * D, H),
                  "self_attn.o_proj": (H, NH * D), "mlp.gate_proj": (FF, H), "mlp.up_proj": (FF, H),
                  "mlp.down_proj": (H, FF)}
        for n, s in shapes.items():
            t[p + n + ".weight"] = r.normal(0, 0.3, s)
        t[p + "input_layernorm.weight"] = 1 + 0.1 * r.normal(size=H)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * r.normal(size=H)
        if arch == "qwen2":
            for n in ("q_proj", "k_proj", "v_proj"):
                t[p + f"self_attn.{n}.bias"] = r.normal(0, 0.5, t[p + f"self_attn.{n}.weight"].shape[0])
        if arch == "qwen3":
            t[p + "self_attn.q_norm.weight"] = 1 + 0.1 * r.normal(size=D)
            t[p + "self_attn.k_norm.weight"] = 1 + 0.1 * r.normal(size=D)
    return meta, {k: np.asarray(v, np.float32) for k, v in t.items()}


def random_factors(r, shared: bool):
    sp = np.exp(r.normal(0, 1, (L, 1 if shared else NKV, D // 2)))
    s = np.broadcast_to(np.concatenate([sp, sp], -1), (L, NKV, D)).astype(np.float32)
    t = np.broadcast_to(np.exp(r.normal(0, 1, (L, 1 if shared else NKV, D))), (L, NKV, D)).astype(np.float32)
    return np.ascontiguousarray(s), np.ascontiguousarray(t)


IDS = np.array([3, 17, 5, 42, 8, 8, 1, 29, 33, 11, 0, 49], np.int64)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fold_leaves_logits_unchanged(arch):
    meta, t = tiny(arch)
    base = TorchLlama(meta, t).logits(IDS)
    s, v = random_factors(np.random.default_rng(1), shared=arch == "qwen3")
    got = TorchLlama(meta, fold(t, meta, s, v)).logits(IDS)
    err = np.abs(got - base).max() / np.abs(base).max()
    assert err < 2e-5, f"{arch}: smoothed logits differ by {err:.2e} of the largest"
    if arch != "qwen3":  # the folded rows really changed
        assert not np.allclose(fold(t, meta, s, v)["model.layers.0.self_attn.k_proj.weight"],
                               t["model.layers.0.self_attn.k_proj.weight"])


def test_factors_unequal_within_a_rope_pair_change_the_logits():
    meta, t = tiny("llama")
    base = TorchLlama(meta, t).logits(IDS)
    r = np.random.default_rng(2)
    s = np.exp(r.normal(0, 1, (L, NKV, D))).astype(np.float32)  # s_i != s_{i+D/2}
    got = TorchLlama(meta, fold(t, meta, s, np.ones_like(s))).logits(IDS)
    assert np.abs(got - base).max() / np.abs(base).max() > 1e-2


def test_factors_put_each_heads_largest_channel_on_the_level():
    r = np.random.default_rng(3)
    kp, vm = np.exp(r.normal(0, 1, (L, NKV, D // 2))), np.exp(r.normal(0, 1, (L, NKV, D)))
    s, t = factors(kp, vm, alpha=0.5, alpha_v=1.0, level=32.0)
    assert s.shape == t.shape == (L, NKV, D) and np.array_equal(s[..., : D // 2], s[..., D // 2:])
    np.testing.assert_allclose((kp / s[..., : D // 2]).max(-1), 32.0, rtol=1e-5)
    np.testing.assert_allclose(vm / t, 32.0, rtol=1e-5)  # alpha_v = 1: every V channel on the level
    s0, t0 = factors(kp, vm, alpha=0.0, alpha_v=0.0)
    assert (s0 == 1).all() and (t0 == 1).all()
    k = r.normal(size=(5, D))
    np.testing.assert_allclose(pair_norm(k) ** 2, k[:, : D // 2] ** 2 + k[:, D // 2:] ** 2)


def test_fold_rejects_factors_of_the_wrong_shape():
    meta, t = tiny("llama")
    with pytest.raises(ValueError, match=r"shape \(2, 3, 16\).*expected \(2, 2, 16\)"):
        fold(t, meta, np.ones((L, 3, D), np.float32), np.ones((L, 3, D), np.float32))
