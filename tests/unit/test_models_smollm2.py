"""The real SmolLM2-135M-Instruct GGUF (from `kvdeck models fetch smollm2-135m`'s download cache;
skipped when absent): tokenizer ids, chat template, config values, and the end-to-end check that
the converted f32 weights, loaded into transformers' LlamaForCausalLM, answer coherently — the
proof that Q/K un-permutation is right (a wrong permutation gives garbage)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.fetch import DOWNLOADS_DIR

GGUF = DOWNLOADS_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} absent (run `kvdeck models fetch smollm2-135m`)")

# Reference ids: transformers' own GGUF tokenizer (AutoTokenizer.from_pretrained(..., gguf_file=...)).
REF_IDS = {
    "What is the capital of France?": [1780, 314, 260, 3575, 282, 4649, 47],
    "<|im_start|>user\nHi 😀 12345 héllo<|im_end|>\n":
        [1, 4093, 198, 26843, 40303, 218, 216, 33, 34, 35, 36, 37, 294, 2756, 31394, 2, 198],
    "def f(x):\n    return x**2  # ok\n\n": [1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 10907, 1116],
    "  leading spaces\ttabs": [216, 2899, 5600, 197, 100, 7366],
}


@pytest.fixture(scope="module")
def source():
    from models.gguf_source import load_gguf

    return load_gguf(GGUF, "smollm2-135m")


@pytest.fixture(scope="module")
def tokenizer(source):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(source.tokenizer_json)


def test_config_values(source):
    m = source.meta
    assert m["architecture"] == "llama"
    assert (m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"]) == (576, 1536, 30)
    assert (m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"]) == (9, 3, 64)
    assert (m["vocab_size"], m["max_position_embeddings"]) == (49152, 8192)
    assert m["rope_theta"] == 100000.0 and m["rms_norm_eps"] == 1e-5
    assert m["tie_word_embeddings"] is True and m["attention_bias"] is False and m["qk_norm"] is False
    assert (m["bos_token_id"], m["eos_token_id"]) == (1, 2)
    assert m["chat_format"] == "chatml" and m["stop_token_ids"] == [2]  # eos IS <|im_end|>


def test_tokenizer_ids_and_roundtrip(tokenizer):
    for s, ids in REF_IDS.items():
        assert tokenizer.encode(s).ids == ids, s
    assert tokenizer.token_to_id("<|im_end|>") == 2 and tokenizer.token_to_id("<|im_start|>") == 1
    for s in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        assert len(tokenizer.encode(s).ids) == 1, s
    for s in ["naïve café 東京 — 😀🚀 x²", "3.14159 + 2024 = 0xFF", "for i in range(10):\n\tprint(i)\n",
              "  \n\n  trailing  ", "<|im_start|>system\nok<|im_end|>"]:
        assert tokenizer.decode(tokenizer.encode(s).ids, skip_special_tokens=False) == s


def test_chat_template_renders(source, tokenizer):
    import jinja2

    tpl = jinja2.Environment().from_string(source.meta["chat_template"])
    text = tpl.render(messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.encode(text).ids
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2


@pytest.mark.slow
def test_f32_folder_generates_coherent_text(source, tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import jinja2
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from models.gguf_source import permute_rows
    from models.writer import write_format

    folder = write_format(source, "f32", tmp_path_factory.mktemp("w"), {"nvfp4_block": 16, "w4a8_group": 32})
    c = json.loads((folder / "config.json").read_text())
    cfg = transformers.LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"], rms_norm_eps=c["rms_norm_eps"],
        rope_theta=c["rope_theta"], max_position_embeddings=c["max_position_embeddings"],
        tie_word_embeddings=c["tie_word_embeddings"], bos_token_id=c["bos_token_id"], eos_token_id=c["eos_token_id"])
    sd = load_file(str(folder / "model.safetensors"))
    assert "lm_head.weight" not in sd
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompt = jinja2.Environment().from_string(c["chat_template"]).render(
        messages=[{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    ids = torch.tensor([tok.encode(prompt).ids])

    def answer(state: dict[str, np.ndarray]) -> str:
        model = transformers.LlamaForCausalLM(cfg).eval()
        missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}
        model.tie_weights()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=c["stop_token_ids"])
        return tok.decode(out[0, ids.shape[1]:].tolist())

    text = answer(sd)
    assert "Paris" in text, text
    # negative control: GGUF's interleaved Q/K rows (not un-permuted) must break the model
    bad = dict(sd)
    for k in sd:
        if k.endswith("q_proj.weight"):
            bad[k] = permute_rows(sd[k], c["num_attention_heads"])
        elif k.endswith("k_proj.weight"):
            bad[k] = permute_rows(sd[k], c["num_key_value_heads"])
    assert "Paris" not in answer(bad)
