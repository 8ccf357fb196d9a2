"""The incremental weight upload (_native.WeightsBuilder, kvdeck/weights_loader.h): each
tensor is checked against the config and copied before add() returns; finish() installs
the weights. A tiny random model (1 layer, hidden 32) keeps every case fast."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import _native
from app.engine.loader import upload_arrays

V, H, F, NH, NKV, D = 16, 32, 64, 2, 1, 16
LINEARS = {"self_attn.q_proj": (NH * D, H), "self_attn.k_proj": (NKV * D, H), "self_attn.v_proj": (NKV * D, H),
           "self_attn.o_proj": (H, NH * D), "mlp.gate_proj": (F, H), "mlp.up_proj": (F, H), "mlp.down_proj": (H, F)}


def new_engine() -> _native.Engine:
    cfg = {"hidden": H, "intermediate": F, "n_layers": 1, "n_heads": NH, "n_kv_heads": NKV, "head_dim": D,
           "vocab": V, "rms_eps": 1e-5, "rope_inv_freq": (1.0 / 10000 ** (np.arange(0, D, 2) / D)).tolist()}
    return _native.Engine(cfg, {"kv": "f32", "threads": 1, "kv_pages": 8, "kv_block": 4, "max_chunk": 16})


def tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = {"model.embed_tokens.weight": rng.standard_normal((V, H)).astype(np.float32) * 0.2,
         "model.norm.weight": np.ones(H, np.float32),
         "model.layers.0.input_layernorm.weight": np.ones(H, np.float32),
         "model.layers.0.post_attention_layernorm.weight": np.ones(H, np.float32)}
    for name, shape in LINEARS.items():
        t[f"model.layers.0.{name}.weight"] = (rng.standard_normal(shape) * 0.2).astype(np.float32)
    return t


def logits(eng) -> np.ndarray:
    seq = eng.open_sequence(1)
    out = eng.forward(seq, np.array([3, 1, 4, 1, 5], np.int32))
    eng.close_sequence(seq)
    return out


def test_upload_order_does_not_matter_and_buffers_may_be_reused():
    t = tensors()
    ref = new_engine()
    upload_arrays(ref, t, True)
    eng = new_engine()
    b = _native.WeightsBuilder(eng, True)
    for name in sorted(t, reverse=True):
        scratch = t[name].copy()
        b.add(name, scratch)
        scratch[...] = 123.0  # the engine copied it already
    assert b.count == len(t)
    assert b.uploaded_bytes == sum(a.nbytes for a in t.values()) == eng.weight_bytes
    b.finish()
    np.testing.assert_array_equal(logits(eng), logits(ref))
    assert np.abs(logits(eng)).max() < 100  # not the 123s


def test_strided_input_is_copied_in_row_major_order():
    t = tensors()
    ref = new_engine()
    upload_arrays(ref, t, True)
    eng = new_engine()
    name = "model.layers.0.mlp.gate_proj.weight"
    t2 = dict(t)
    t2[name] = np.asfortranarray(t[name])  # same values, column-major memory
    upload_arrays(eng, t2, True)
    np.testing.assert_array_equal(logits(eng), logits(ref))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.__setitem__("model.layers.1.input_layernorm.weight", np.ones(H, np.float32)),
         r"unexpected tensor model\.layers\.1\.input_layernorm\.weight \(not a tensor of this model: 1 layers"),
        (lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.bias", np.ones(NH * D, np.float32)),
         r"unexpected tensor model\.layers\.0\.self_attn\.q_proj\.bias .*attn_bias off"),
        (lambda t: t.__setitem__("model.norm.weight", np.ones(H + 1, np.float32)),
         r"tensor model\.norm\.weight has shape \[33\], expected \[32\]"),
        (lambda t: t.__setitem__("model.norm.weight", np.ones(H, np.float64)),
         r"tensor model\.norm\.weight has dtype f8 \(f32, f16, u8 or i8 expected\)"),
        (lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight", np.ones((F, H), np.uint8)),
         r"tensor model\.layers\.0\.mlp\.up_proj\.weight has dtype u8, expected f32 or f16"),
        (lambda t: t.pop("model.layers.0.post_attention_layernorm.weight"),
         r"tensor model\.layers\.0\.post_attention_layernorm\.weight is missing"),
        (lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight.codes", np.zeros((H, F // 2), np.uint8)),
         r"tensor model\.layers\.0\.mlp\.down_proj\.weight\.codes is not used"),
        (lambda t: t.__setitem__("model.embed_tokens.weight.codes", np.zeros((V, H // 2), np.uint8)),
         r"model\.embed_tokens must be f32 or f16 rows, or int8 codes"),
    ],
)
def test_bad_tensors_are_named(edit, message):
    t = tensors()
    edit(t)
    with pytest.raises(ValueError, match=message):
        upload_arrays(new_engine(), t, True)


def test_quantised_forms_must_agree():
    # nvfp4 codes with f16 (w4a8) scales plus an nvfp4 tensor scale: refused, naming the tensor.
    t = tensors()
    p = "model.layers.0.mlp.gate_proj"
    del t[p + ".weight"]
    t[p + ".weight.codes"] = np.zeros((F, H // 2), np.uint8)
    t[p + ".weight.scales"] = np.ones((F, 1), np.float16)
    t[p + ".weight.tscale"] = np.ones(1, np.float32)
    with pytest.raises(ValueError, match=r"gate_proj\.weight\.scales is f16 \(w4a8\) but .*tscale \(nvfp4\) is present"):
        upload_arrays(new_engine(), t, True)


def test_a_builder_is_used_once():
    t = tensors()
    eng = new_engine()
    b = _native.WeightsBuilder(eng, True)
    name = "model.norm.weight"
    b.add(name, t[name])
    with pytest.raises(ValueError, match=r"tensor model\.norm\.weight given twice"):
        b.add(name, t[name])
    for n in sorted(set(t) - {name}):
        b.add(n, t[n])
    b.finish()
    with pytest.raises(ValueError, match="finish\\(\\) called twice"):
        b.finish()
    with pytest.raises(ValueError, match=r"added after finish"):
        b.add("lm_head.weight", np.zeros((V, H), np.float32))
