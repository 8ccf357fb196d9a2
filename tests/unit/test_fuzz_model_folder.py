"""Fuzzing the runtime loader (app.engine.load_engine) with damaged kvdeck model folders.

Tiny folders (1 layer, hidden 16, vocab 260) are converted once: f32, nvfp4, w4a8, and an f32
one with Qwen-style q/k/v biases and q/k norms added. Each example damages one folder's
config.json (a field dropped, or set to a value of the wrong type or range) or its
model.safetensors (truncated, bit-flipped, a tensor dropped / renamed / added / reshaped /
retyped). Properties:

* load_engine raises EngineError (whose message names config.json or model.safetensors) or
  returns an engine; nothing else escapes;
* a loaded engine is a faithful reading: with a damaged config, every field it reports equals
  the file's value (nothing coerced) and its logits are finite; with a damaged safetensors, its
  logits equal those of the same tensors decoded by the reference safetensors library and saved
  again cleanly (so no tensor was read from the wrong bytes, shape or dtype).
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from app.engine import EngineError, load_engine
from models.fetch import convert
from tests.unit.test_models_errors import make_hf_folder

from tests.unit._fuzz import fuzz_settings  # noqa: E402

STATS: Counter = Counter()
FUZZ = fuzz_settings(40)
IDS = [0, 5, 17, 259, 3]
CONFIG_KEYS = ["format_version", "architecture", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "rope_theta",
               "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "attention_bias", "qk_norm",
               "bos_token_id", "eos_token_id", "stop_token_ids", "chat_format", "chat_template", "rope_scaling",
               "weights"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-folder")
    src = make_hf_folder(root / "src")
    out = {f.name: f for f in convert(src, name="tiny", formats="f32,nvfp4,w4a8", out=root / "out")}
    # Qwen-style extras on the f32 folder: q/k/v biases and q/k norms, switched on in config.json
    q = root / "out" / "tiny-qwen" / "f32"
    shutil.copytree(out["f32"], q)
    t = load_file(str(q / "model.safetensors"))
    rng = np.random.default_rng(1)
    p = "model.layers.0.self_attn."
    t.update({p + "q_proj.bias": rng.standard_normal(16).astype(np.float32),
              p + "k_proj.bias": rng.standard_normal(8).astype(np.float32),
              p + "v_proj.bias": rng.standard_normal(8).astype(np.float32),
              p + "q_norm.weight": rng.standard_normal(8).astype(np.float32),
              p + "k_norm.weight": rng.standard_normal(8).astype(np.float32)})
    save_file(t, str(q / "model.safetensors"))
    cfg = json.loads((q / "config.json").read_text())
    cfg.update(architecture="qwen3", attention_bias=True, qk_norm=True)
    (q / "config.json").write_text(json.dumps(cfg))
    out["qwen"] = q
    return out


def _copy(folder: Path, into: Path) -> Path:
    dst = into / folder.name
    shutil.copytree(folder, dst)
    return dst


def _load(folder: Path):
    """load_engine or None on EngineError (which must name a file of the folder)."""
    try:
        return load_engine(folder, max_context=64)
    except EngineError as e:
        assert any(n in str(e) for n in ("config.json", "model.safetensors", "tokenizer.json")), str(e)
        return None


def test_clean_folders_load(folders):
    for name, f in folders.items():
        eng = load_engine(f, max_context=64)
        assert np.isfinite(eng.logits(IDS)).all(), name


# ---- config.json ------------------------------------------------------------------------------
odd_values = st.one_of(
    st.integers(-5, 40), st.sampled_from([0, -1, 2**31, 2**63, 10**30, 10**400]), st.floats(allow_nan=True),
    st.booleans(), st.none(), st.text(max_size=5), st.sampled_from(["llama", "qwen2", "f32", "nvfp4", "1"]),
    st.lists(st.integers(-2, 300), max_size=3),
    st.fixed_dictionaries({"rope_type": st.sampled_from(["llama3", "yarn", "default", 3]),
                           "factor": st.one_of(st.floats(-1, 64), st.integers(-1, 64), st.none()),
                           "low_freq_factor": st.floats(-1, 8), "high_freq_factor": st.floats(-1, 8),
                           "original_max_position_embeddings": st.integers(-1, 64)}),
    st.dictionaries(st.sampled_from(["format", "recipe"]), st.one_of(st.text(max_size=5), st.integers())))


@pytest.mark.parametrize("fmt", ["f32", "nvfp4", "qwen"])
@FUZZ
@given(data=st.data())
def test_damaged_config(folders, fmt, data):
    edits = data.draw(st.dictionaries(st.sampled_from(CONFIG_KEYS), st.one_of(st.just("<drop>"), odd_values),
                                      min_size=1, max_size=2))
    with tempfile.TemporaryDirectory() as d:
        f = _copy(folders[fmt], Path(d))
        raw = json.loads((f / "config.json").read_text())
        for k, v in edits.items():
            if v == "<drop>":
                raw.pop(k, None)
            else:
                raw[k] = v
        (f / "config.json").write_text(json.dumps(raw))
        eng = _load(f)
        STATS[f"config:{'loaded' if eng else 'refused'}"] += 1
        if eng is None:
            return
        c = eng.config
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "vocab_size", "rope_theta", "rms_norm_eps", "bos_token_id",
                    "eos_token_id"):
            if key in raw:
                want = float(raw[key]) if key in ("rope_theta", "rms_norm_eps") else raw[key]
                assert getattr(c, key) == want, key
        for key in ("tie_word_embeddings", "attention_bias", "qk_norm"):  # null: the default
            if raw.get(key) is not None:
                assert getattr(c, key) is raw[key], key
        assert c.chat_template == (raw.get("chat_template") or "")
        assert np.isfinite(eng.logits(IDS)).all(), f"non-finite logits after {edits}"


# ---- model.safetensors ------------------------------------------------------------------------
def _damage(data, f: Path) -> str:
    """Damage f/model.safetensors in one of several ways; returns the kind."""
    st_path = f / "model.safetensors"
    kind = data.draw(st.sampled_from(["truncate", "bitflip", "drop", "rename", "extra", "reshape", "retype"]))
    blob = st_path.read_bytes()
    if kind == "truncate":
        st_path.write_bytes(blob[: data.draw(st.integers(0, len(blob) - 1))])
        return kind
    if kind == "bitflip":
        buf = bytearray(blob)
        hlen = int.from_bytes(blob[:8], "little")
        in_header = data.draw(st.booleans())
        i = data.draw(st.integers(0, 8 + hlen - 1) if in_header else st.integers(8 + hlen, len(buf) - 1))
        buf[i] ^= 1 << data.draw(st.integers(0, 7))
        st_path.write_bytes(bytes(buf))
        return kind + (":header" if in_header else ":data")
    t = load_file(str(st_path))
    name = data.draw(st.sampled_from(sorted(t)))
    before = t[name]
    if kind == "drop":
        del t[name]
    elif kind == "rename":
        t[name.replace("layers.0", "layers.1") if "layers.0" in name else name + ".x"] = t.pop(name)
    elif kind == "extra":
        t[data.draw(st.sampled_from(["model.layers.1.input_layernorm.weight", "lm_head.weight",
                                     "model.layers.0.self_attn.o_proj.bias", "model.layers.0.mlp.up_proj.weight.mins"]))] = \
            np.ones(16, np.float32)
    elif kind == "reshape":  # same bytes, another shape
        a = t[name]
        shapes = [(a.size,), (1, a.size), (a.size // 2, 2) if a.size % 2 == 0 else (a.size, 1), a.shape[::-1]]
        t[name] = a.reshape(data.draw(st.sampled_from(shapes)))
    else:  # same bytes, another dtype
        a = np.ascontiguousarray(t[name])
        to = data.draw(st.sampled_from([np.uint8, np.float16, np.float32, np.int32]))
        if a.nbytes % np.dtype(to).itemsize == 0 and a.dtype != to:
            t[name] = a.reshape(-1).view(to)
    if kind in ("reshape", "retype") and t[name].shape == before.shape and t[name].dtype == before.dtype:
        return "unchanged"
    save_file(t, str(st_path))
    return kind


@pytest.mark.parametrize("fmt", ["f32", "nvfp4", "w4a8", "qwen"])
@FUZZ
@given(data=st.data())
def test_damaged_safetensors(folders, fmt, data):
    with tempfile.TemporaryDirectory() as d:
        f = _copy(folders[fmt], Path(d))
        kind = _damage(data, f)
        eng = _load(f)
        STATS[f"safetensors:{kind.split(':')[0]}:{'loaded' if eng else 'refused'}"] += 1
        if kind.startswith(("truncate", "drop", "rename", "extra")):
            assert eng is None, f"{kind}: a damaged folder loaded"
        if kind == "bitflip:data":
            assert eng is not None, "a flip inside tensor data must not break the file's structure"
        if eng is None:
            return
        # Oracle: what the reference library reads from the same file, saved again cleanly.
        clean = Path(d) / "clean"
        shutil.copytree(f, clean)
        save_file(load_file(str(f / "model.safetensors")), str(clean / "model.safetensors"))
        ref = load_engine(clean, max_context=64)
        np.testing.assert_array_equal(eng.logits(IDS), ref.logits(IDS), err_msg=kind)


def test_named_runtime_faults(folders, tmp_path):
    """A few faults, each with the message a user needs."""
    f = _copy(folders["f32"], tmp_path)
    cfg_path = f / "config.json"
    good = json.loads(cfg_path.read_text())
    cases = [
        ({"num_key_value_heads": 3}, r"num_attention_heads 2 is not a multiple of num_key_value_heads 3"),
        ({"hidden_size": -16}, r"field 'hidden_size' should be an integer"),
        ({"num_hidden_layers": 2}, r"tensor model\.layers\.1\.input_layernorm\.weight is missing"),
        ({"vocab_size": 300}, r"model\.embed_tokens\.weight has shape \[260, 16\], config\.json implies \[300, 16\]"),
        ({"head_dim": 7}, r"head_dim 7 must be even"),
        ({"tie_word_embeddings": "false"}, r"field 'tie_word_embeddings' should be true or false"),
        ({"attention_bias": True}, r"model\.layers\.0\.self_attn\.q_proj\.bias is missing"),
        ({"eos_token_id": 260}, r"field 'eos_token_id' should be a token id in \[0, 260\)"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, r"rope_scaling field 'original_max_position_embeddings'"),
        ({"weights": {"format": "nvfp4"}}, r"linear model\.layers\.0\.self_attn\.q_proj is f32, but config\.json says"),
    ]
    for edit, message in cases:
        cfg_path.write_text(json.dumps({**good, **edit}))
        with pytest.raises(EngineError, match=message):
            load_engine(f, max_context=64)
    cfg_path.write_text(json.dumps(good))
    t = load_file(str(f / "model.safetensors"))
    t["model.layers.1.mlp.up_proj.weight"] = np.zeros((32, 16), np.float32)
    save_file(t, str(f / "model.safetensors"))
    with pytest.raises(EngineError, match=r"tensors model\.layers\.1\.mlp\.up_proj\.weight are not part of the model"):
        load_engine(f, max_context=64)
    (f / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}" + b"\0")
    with pytest.raises(EngineError, match=r"1 bytes after the last tensor"):
        load_engine(f, max_context=64)


def test_zz_fuzz_statistics():
    """Reports the examples per damage kind (pytest -s)."""
    print("\nmodel folder fuzz examples:", dict(sorted(STATS.items())), "total", sum(STATS.values()))
