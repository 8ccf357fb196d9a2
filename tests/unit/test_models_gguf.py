"""GGUF → kvdeck folder on a tiny synthetic GGUF written with gguf.GGUFWriter.

The GGUF is written as llama.cpp's converter writes a Llama: HF names mapped to GGUF names, Q and
K rows permuted with llama.cpp's ``permute`` (copied below, independent of models/), f32 data.
Contract checked: our reader un-permutes Q/K back to the original HF rotate-half rows, every
other tensor round-trips exactly, config values and the tokenizer come from the metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from safetensors.numpy import load_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from models.fetch import convert  # noqa: E402
from models.gguf_source import load_gguf, permute_rows, unpermute_rows  # noqa: E402

N_HEAD, N_KV, HD, H, FF, L = 4, 2, 8, 32, 48, 2
CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def llamacpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """Verbatim from llama.cpp convert_hf_to_gguf.py (LlamaModel.permute)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """Byte-level vocabulary: 3 control tokens, the 256 byte symbols, a few merges."""
    from tokenizers import pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he"]
    tokens = specials + alphabet + ["Ġt", "he", "Ġthe"]
    types = [3] * 3 + [1] * (len(tokens) - 3)
    return tokens, merges, types


def write_tiny_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Write a 2-layer f32 Llama GGUF; return the original HF state dict (f32 numpy)."""
    rng = np.random.default_rng(seed)
    tokens, merges, types = tiny_vocab()
    V = len(tokens)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    hf = {"model.embed_tokens.weight": r(V, H), "model.norm.weight": r(H), "lm_head.weight": r(V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        hf |= {p + "input_layernorm.weight": r(H), p + "post_attention_layernorm.weight": r(H),
               p + "self_attn.q_proj.weight": r(N_HEAD * HD, H), p + "self_attn.k_proj.weight": r(N_KV * HD, H),
               p + "self_attn.v_proj.weight": r(N_KV * HD, H), p + "self_attn.o_proj.weight": r(H, N_HEAD * HD),
               p + "mlp.gate_proj.weight": r(FF, H), p + "mlp.up_proj.weight": r(FF, H),
               p + "mlp.down_proj.weight": r(H, FF)}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(L)
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHATML)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}
    for name, t in hf.items():
        if name in names:
            gname = names[name]
        else:
            i, rest = name[len("model.layers."):].split(".", 1)
            gname = f"blk.{i}.{sub[rest.rsplit('.', 1)[0]]}.weight"
        if name.endswith("q_proj.weight"):
            t = llamacpp_permute(t, N_HEAD, N_HEAD)
        elif name.endswith("k_proj.weight"):
            t = llamacpp_permute(t, N_HEAD, N_KV)
        w.add_tensor(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def test_unpermute_inverts_llamacpp_permute():
    x = np.arange(6 * 16 * 5, dtype=np.float32).reshape(6 * 16, 5)  # [n_head*hd, K]
    for n in (1, 2, 3, 6):
        np.testing.assert_array_equal(unpermute_rows(llamacpp_permute(x, n, None), n), x)
        np.testing.assert_array_equal(permute_rows(x, n), llamacpp_permute(x, n, None))


def test_tiny_gguf_roundtrip(tmp_path):
    g = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(g)
    src = load_gguf(g, "tiny")
    got = dict(src.tensors())
    assert set(got) == set(hf)
    for k, v in hf.items():
        assert got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)  # Q/K un-permuted exactly
    m = src.meta
    assert (m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"]) == (N_HEAD, N_KV, HD)
    assert (m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"]) == (H, FF, L)
    assert m["rope_theta"] == 50000.0 and m["rms_norm_eps"] == 1e-5 and m["max_position_embeddings"] == 512
    assert m["tie_word_embeddings"] is False and m["vocab_size"] == len(tiny_vocab()[0])
    assert m["chat_format"] == "chatml" and m["stop_token_ids"] == [2] and m["chat_template"] == CHATML


def test_tiny_gguf_convert_folder(tmp_path):
    g = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(g)
    f32, nv = convert(g, name="tiny", formats="f32,nvfp4", out=tmp_path / "out")
    t = load_file(str(f32 / "model.safetensors"))
    for k, v in hf.items():
        np.testing.assert_array_equal(t[k], v, err_msg=k)
    q = load_file(str(nv / "model.safetensors"))
    assert q["lm_head.weight.codes"].shape == (len(tiny_vocab()[0]), H // 2)  # untied: from output.weight
    cfg = json.loads((f32 / "config.json").read_text())
    assert cfg["source"]["kind"] == "gguf" and cfg["source"]["file"] == "tiny.gguf"
    tok = Tokenizer.from_file(str(f32 / "tokenizer.json"))
    s = "<|im_start|>the then 12 ünï 😀<|im_end|>"
    enc = tok.encode(s)
    assert enc.ids[0] == 1 and enc.ids[-1] == 2
    assert tok.token_to_id("Ġthe") in enc.ids
    assert tok.decode(enc.ids, skip_special_tokens=False) == s
