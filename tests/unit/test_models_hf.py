"""HF folder → kvdeck folder: tiny random Llama / Qwen2 / Qwen3 made with transformers.

Contract checked: the f32 folder's tensors equal the source's exactly (names, shapes, values),
bf16 sources are widened exactly, sharded checkpoints are read, the nvfp4/w4a8 folders hold the
quantised names of docs/ENGINE.md, config.json carries the fields the loader needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file  # noqa: E402

from models.fetch import convert  # noqa: E402
from models.hf_source import bf16_to_f32  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level tokenizer (256 byte tokens + ChatML specials) and a tokenizer_config."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    assert tok.get_vocab_size() <= vocab_size
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}))


def make_model(folder: Path, arch: str, tied: bool = False, dtype=None, shard: str | None = None) -> dict:
    """Save a random tiny model of `arch` to folder; return its state dict as f32 numpy."""
    torch.manual_seed(0)
    kw = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              tie_word_embeddings=tied, rms_norm_eps=1e-6, bos_token_id=257, eos_token_id=258)
    if arch == "llama":
        cfg, cls = transformers.LlamaConfig(**kw), transformers.LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = transformers.Qwen2Config(**kw), transformers.Qwen2ForCausalLM
    else:
        cfg, cls = transformers.Qwen3Config(head_dim=32, **kw), transformers.Qwen3ForCausalLM
    model = cls(cfg).eval()
    with torch.no_grad():  # norms are ones at init: make them informative
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kwargs)
    write_tokenizer(folder, kw["vocab_size"])
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def _cfg(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_f32_equals_source(tmp_path, arch):
    src = tmp_path / "src"
    sd = make_model(src, arch)
    (f32,) = convert(src, name="tiny", formats="f32", out=tmp_path / "out")
    got = load_file(str(f32 / "model.safetensors"))
    assert set(got) == set(sd)
    for k, v in sd.items():
        assert got[k].dtype == np.float32, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    cfg = _cfg(f32)
    assert cfg["format_version"] == 1 and cfg["model"] == "tiny" and cfg["architecture"] == arch
    assert cfg["weights"]["format"] == "f32"
    assert cfg["attention_bias"] is (arch == "qwen2")
    assert cfg["qk_norm"] is (arch == "qwen3")
    assert cfg["head_dim"] == (32 if arch == "qwen3" else 16)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (64, 2, 2)
    assert cfg["vocab_size"] == 300 and cfg["tie_word_embeddings"] is False
    assert cfg["chat_format"] == "chatml" and cfg["chat_template"] == CHATML
    assert cfg["eos_token_id"] == 258 and 258 in cfg["stop_token_ids"]
    assert cfg["source"]["kind"] == "hf" and len(cfg["source"]["sha256"]) == 64
    assert (f32 / "tokenizer.json").is_file()


def test_bf16_sharded_tied_and_quantised(tmp_path):
    src = tmp_path / "src"
    sd = make_model(src, "llama", tied=True, dtype=torch.bfloat16, shard="100KB")
    assert (src / "model.safetensors.index.json").is_file()
    out = tmp_path / "out"
    folders = convert(src, name="tiny", formats="f32,f16,nvfp4,w4a8", out=out)
    got = load_file(str(out / "tiny" / "f32" / "model.safetensors"))
    assert "lm_head.weight" not in got  # tied: the engine reads the embedding
    for k, v in sd.items():
        if k != "lm_head.weight":
            np.testing.assert_array_equal(got[k], v, err_msg=k)
    f16 = load_file(str(out / "tiny" / "f16" / "model.safetensors"))
    assert f16["model.embed_tokens.weight"].dtype == np.float16
    assert f16["model.layers.0.self_attn.q_proj.weight"].dtype == np.float16
    assert f16["model.norm.weight"].dtype == np.float32
    for fmt in ("nvfp4", "w4a8"):
        t = load_file(str(out / "tiny" / fmt / "model.safetensors"))
        assert t["model.embed_tokens.weight"].dtype == np.float16
        assert t["model.layers.1.input_layernorm.weight"].dtype == np.float32
        for lin in ("lm_head.", "model.layers.0.self_attn.q_proj.", "model.layers.1.mlp.down_proj."):
            assert t[lin + "weight.codes"].dtype == np.uint8, (fmt, lin)
            assert lin + "weight" not in t
        N, K = 300, 64
        assert t["lm_head.weight.codes"].shape == (N, K // 2)
        if fmt == "nvfp4":
            assert t["lm_head.weight.scales"].shape == (N, K // 16)
            assert t["lm_head.weight.tscale"].shape == (1,)
        else:
            assert t["lm_head.weight.scales"].dtype == np.float16
            assert t["lm_head.weight.scales"].shape == (N, K // 32)
        assert _cfg(out / "tiny" / fmt)["weights"] == {"format": fmt, "recipe": {"nvfp4_block": 16, "w4a8_group": 32,
                                                                                 "scales": "mse"}}
    assert [f.name for f in folders] == ["f32", "f16", "nvfp4", "w4a8"]


def test_convert_is_idempotent(tmp_path):
    src = tmp_path / "src"
    make_model(src, "llama")
    (f32,) = convert(src, name="tiny", formats="f32", out=tmp_path / "out")
    mtime = (f32 / "model.safetensors").stat().st_mtime_ns
    convert(src, name="tiny", formats="f32", out=tmp_path / "out")
    assert (f32 / "model.safetensors").stat().st_mtime_ns == mtime
    assert not list((tmp_path / "out" / "tiny").glob(".*"))  # no temp folders left


def test_bf16_widening_is_exact():
    x = torch.randn(1000).to(torch.bfloat16)
    u16 = x.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_to_f32(u16), x.float().numpy())


def test_llama3_rope_scaling_is_kept(tmp_path):
    """Llama 3.x RoPE scaling (transformers 5 `rope_parameters` or 4.x `rope_scaling`) reaches
    config.json as the optional key "rope_scaling"; plain RoPE writes no such key."""
    src = tmp_path / "src"
    make_model(src, "llama")
    (f32,) = convert(src, name="plain", formats="f32", out=tmp_path / "out")
    assert "rope_scaling" not in _cfg(f32)
    hf = json.loads((src / "config.json").read_text())
    hf.pop("rope_parameters", None)
    hf["rope_theta"] = 500000.0
    hf["rope_scaling"] = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    (src / "config.json").write_text(json.dumps(hf))
    (f32,) = convert(src, name="scaled", formats="f32", out=tmp_path / "out")
    cfg = _cfg(f32)
    assert cfg["rope_theta"] == 500000.0 and cfg["rope_scaling"]["rope_type"] == "llama3"
    assert cfg["rope_scaling"]["factor"] == 32.0
