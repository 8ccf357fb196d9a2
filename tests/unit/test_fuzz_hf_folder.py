"""Fuzzing the converter's reader (models.hf_source.load_hf_folder) with damaged HF folders.

Each example damages a tiny numpy-written Llama folder (tests/unit/test_models_errors.py):
config.json fields dropped or set to values of the wrong type or range, tokenizer_config /
generation_config replaced, or model.safetensors truncated, bit-flipped, or rewritten with a
tensor dropped, renamed, added, reshaped or retyped. Properties:

* load_hf_folder raises ModelError (naming a file of the folder) or returns a source; nothing else;
* an accepted source is faithful: every tensor has the shape its meta implies and equals the
  reference library's decoding of the file; meta sizes equal config.json's values;
* what the converter accepts, the runtime loads: the f32 folder written from it loads with
  app.engine.load_engine and gives finite logits.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from app.engine import load_engine
from models.errors import ModelError
from models.hf_source import load_hf_folder
from models.writer import write_format
from tests.unit.test_models_errors import make_hf_folder

from tests.unit._fuzz import fuzz_settings  # noqa: E402

STATS: Counter = Counter()
FUZZ = fuzz_settings(120)
RECIPE = {"nvfp4_block": 16, "w4a8_group": 32}
HF_KEYS = ["architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
           "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id", "rope_scaling",
           "rope_parameters", "mlp_bias"]
odd_values = st.one_of(
    st.integers(-3, 40), st.sampled_from([0, 2**31, 2**64, 10**400, 260, 8, 16, 32]), st.floats(allow_nan=True),
    st.booleans(), st.none(), st.text(max_size=4), st.lists(st.integers(-2, 300), max_size=2),
    st.sampled_from([["LlamaForCausalLM"], ["Qwen2ForCausalLM"], ["GPT2"], "LlamaForCausalLM", [3]]),
    st.fixed_dictionaries({"rope_type": st.sampled_from(["llama3", "yarn", "default"]),
                           "factor": st.one_of(st.floats(-1, 40), st.none()),
                           "original_max_position_embeddings": st.integers(-1, 64)}))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return make_hf_folder(tmp_path_factory.mktemp("hf-fuzz") / "m")


def _damage(data, f: Path) -> str:
    kind = data.draw(st.sampled_from(["config", "config", "side", "truncate", "bitflip", "drop", "rename",
                                      "extra", "reshape", "retype"]))
    if kind == "config":
        raw = json.loads((f / "config.json").read_text())
        for k, v in data.draw(st.dictionaries(st.sampled_from(HF_KEYS), st.one_of(st.just("<drop>"), odd_values),
                                              min_size=1, max_size=2)).items():
            raw.pop(k, None) if v == "<drop>" else raw.__setitem__(k, v)
        (f / "config.json").write_text(json.dumps(raw))
        return kind
    if kind == "side":
        name = data.draw(st.sampled_from(["tokenizer_config.json", "generation_config.json", "config.json"]))
        body = data.draw(st.one_of(st.just("[1, 2]"), st.just("{not json"), st.just('"text"'),
                                   st.builds(lambda v: json.dumps({"eos_token_id": v, "eos_token": v,
                                                                   "chat_template": v}), odd_values)))
        (f / name).write_text(body)
        return kind
    path = f / "model.safetensors"
    blob = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(blob[: data.draw(st.integers(0, len(blob) - 1))])
        return kind
    if kind == "bitflip":
        buf = bytearray(blob)
        start = 8 + int.from_bytes(blob[:8], "little")  # the data region
        in_data = data.draw(st.booleans())
        i = data.draw(st.integers(start, len(buf) - 1) if in_data else st.integers(0, start - 1))
        buf[i] ^= 1 << data.draw(st.integers(0, 7))
        path.write_bytes(bytes(buf))
        return "bitflip-data" if in_data else "bitflip-header"
    t = load_file(str(path))
    name = data.draw(st.sampled_from(sorted(t)))
    a = t[name]
    if kind == "drop":
        del t[name]
    elif kind == "rename":
        t[name + ".x"] = t.pop(name)
    elif kind == "extra":
        t[data.draw(st.sampled_from(["model.layers.1.input_layernorm.weight", "model.layers.0.self_attn.o_proj.bias",
                                     "model.layers.0.mlp.up_proj.bias"]))] = np.ones(16, np.float32)
    elif kind == "reshape":
        t[name] = a.reshape(data.draw(st.sampled_from([(a.size,), (1, a.size), a.shape[::-1]])))
    else:
        t[name] = a.reshape(-1).view(data.draw(st.sampled_from([np.int32, np.uint8, np.float16])))
    if kind == "reshape" and t[name].shape == a.shape:
        return "unchanged"
    save_file(t, str(path))
    return kind


def _implied_shapes(meta: dict) -> dict[str, tuple[int, ...]]:
    H, F, D, V = meta["hidden_size"], meta["intermediate_size"], meta["head_dim"], meta["vocab_size"]
    QD, KD = meta["num_attention_heads"] * D, meta["num_key_value_heads"] * D
    s = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not meta["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, H)
    for i in range(meta["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                  p + "self_attn.q_proj.weight": (QD, H), p + "self_attn.k_proj.weight": (KD, H),
                  p + "self_attn.v_proj.weight": (KD, H), p + "self_attn.o_proj.weight": (H, QD),
                  p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H),
                  p + "mlp.down_proj.weight": (H, F)})
    return s


@FUZZ
@given(data=st.data())
def test_damaged_hf_folder(source, data):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "m"
        shutil.copytree(source, f)
        kind = _damage(data, f)
        try:
            src = load_hf_folder(f)
        except ModelError as e:
            assert str(f) in str(e), str(e)
            STATS[f"{kind}:refused"] += 1
            assert kind not in ("unchanged", "bitflip-data"), f"{kind}: a structurally sound folder was refused: {e}"
            return
        STATS[f"{kind}:accepted"] += 1
        assert kind not in ("truncate", "drop", "rename", "extra"), f"{kind}: a damaged folder was accepted"
        meta, hf = src.meta, json.loads((f / "config.json").read_text())
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            assert meta[k] == hf[k], k
        ref = load_file(str(f / "model.safetensors"))
        shapes = _implied_shapes(meta)
        got = dict(src.tensors())
        assert set(got) == set(shapes)
        for n, w in got.items():
            assert w.shape == shapes[n] and w.dtype == np.float32, n
            np.testing.assert_array_equal(w, ref[n].astype(np.float32), err_msg=n)
        out = write_format(src, "f32", Path(d) / "out", RECIPE)
        logits = load_engine(out, max_context=32).logits([0, 1, 2])
        if all(np.abs(w).max() < 100 for w in got.values()):  # a flipped exponent may overflow
            assert np.isfinite(logits).all()


def test_named_converter_faults(source, tmp_path):
    """A few faults, each with the message a user needs."""
    f = tmp_path / "m"
    shutil.copytree(source, f)
    good = json.loads((f / "config.json").read_text())
    cases = [
        ({"num_hidden_layers": None}, r"config\.json: field 'num_hidden_layers' is missing"),
        ({"num_attention_heads": 0}, r"field 'num_attention_heads' should be an integer in \[1,"),
        ({"num_key_value_heads": 3}, r"num_attention_heads 2 is not a multiple of num_key_value_heads 3"),
        ({"hidden_size": 17}, r"hidden_size 17 is not a multiple of num_attention_heads 2"),
        ({"head_dim": 5}, r"head_dim 5 must be even"),
        ({"rope_theta": -1}, r"field 'rope_theta' should be a finite number above 1"),
        ({"tie_word_embeddings": "yes"}, r"field 'tie_word_embeddings' should be true or false"),
        ({"eos_token_id": "x"}, r"field 'eos_token_id' should be a token id"),
        ({"eos_token_id": 999}, r"token ids \[999\] .* outside the vocabulary \[0, 260\)"),
        ({"vocab_size": 300}, r"tensor 'model\.embed_tokens\.weight' has shape \[260, 16\], config\.json implies \[300, 16\]"),
        ({"num_key_value_heads": 2}, r"tensor 'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \[8, 16\], config\.json implies \[16, 16\]"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64,
                           "low_freq_factor": 4.0, "high_freq_factor": 1.0}}, r"high_freq_factor 1\.0 must exceed"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling type 'yarn' is not supported"),
    ]
    for edit, message in cases:
        (f / "config.json").write_text(json.dumps({**good, **edit}))
        with pytest.raises(ModelError, match=message):
            load_hf_folder(f)
    (f / "config.json").write_text(json.dumps(good))
    t = load_file(str(f / "model.safetensors"))
    t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"].T.copy().reshape(8, 32)
    save_file(t, str(f / "model.safetensors"))
    with pytest.raises(ModelError, match=r"q_proj\.weight' has shape \[8, 32\], config\.json implies \[16, 16\]"):
        load_hf_folder(f)
    t["model.layers.0.self_attn.q_proj.weight"] = np.zeros((16, 16), np.int32)
    save_file(t, str(f / "model.safetensors"))
    with pytest.raises(ModelError, match=r"q_proj\.weight' has dtype I32, expected a float type"):
        load_hf_folder(f)


def test_zz_fuzz_statistics():
    """Reports the examples per damage kind (pytest -s)."""
    print("\nHF folder fuzz examples:", dict(sorted(STATS.items())), "total", sum(STATS.values()))
